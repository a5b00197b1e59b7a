"""Every file format, mutated (mutations.py), through every command that reads it (targets.py):
the bad-input contract holds (harness.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, note, strategies as st

from tests.fuzz.harness import assert_contract, invoke, invoke_subprocess
from tests.fuzz.mutations import mutants
from tests.fuzz.settings import fuzz_settings
from tests.fuzz.targets import FORMATS, fmt_of, read_seed

SEED_CASES = [(f, seed, command) for f in FORMATS for seed in f.seeds for command in f.commands]


@pytest.mark.parametrize("fmt, seed, command", SEED_CASES,
                         ids=[f"{f.name}-{s.name}-{c.__name__}" for f, s, c in SEED_CASES])
def test_every_seed_is_accepted_unchanged(fmt, seed, command, tmp_path):
    """The mutations start from valid files: each seed passes each command that reads it (exit 0)."""
    argv, _ = command(seed, tmp_path)
    assert_contract(invoke(argv), allowed={0})


def _fuzz_once(fmt, data, runner) -> None:
    seed = data.draw(st.sampled_from(fmt.seeds), label="seed")
    command = data.draw(st.sampled_from(fmt.commands), label="command")
    mutant = data.draw(mutants(read_seed(seed), fmt_of(seed)), label="mutant")
    note(f"mutation of {seed.name}: {mutant.how}; file starts {mutant.data[:300]!r}")
    with tempfile.TemporaryDirectory(prefix="hppctl-fuzz-") as tmp:
        fuzzed = Path(tmp) / f"fuzzed{seed.suffix}"
        fuzzed.write_bytes(mutant.data)
        argv, outputs = command(fuzzed, Path(tmp))
        assert_contract(runner(argv), outputs)


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
@fuzz_settings(max_examples=15)
@given(data=st.data())
def test_a_mutated_file_keeps_the_contract(fmt, data):
    _fuzz_once(fmt, data, invoke)


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
@fuzz_settings(max_examples=1)
@given(data=st.data())
def test_a_mutated_file_keeps_the_contract_in_a_real_process(fmt, data):
    """A small sample as real processes: what the in-process runner cannot see (a traceback printed
    by the interpreter itself, a hang in C, the exit status as the shell gets it)."""
    _fuzz_once(fmt, data, invoke_subprocess)
