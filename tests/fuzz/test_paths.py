"""Hostile paths: inputs that are not regular files (a FIFO, a folder, a symlink loop, a path through
a file, a 300-character name) and outputs that are not (a symlink to someone's file, a FIFO).

Inputs must be refused with exit 2 and one line; outputs must be refused, or written without
touching what a symlink points to or replacing a FIFO (issue 23, items 5, 7 and 8).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fuzz.harness import assert_contract, invoke
from tests.fuzz.targets import FORMATS_BY_NAME, TINY_PLAN, TINY_PROFILE

FIFO_BOUND_S = 5
"""A FIFO nobody writes to blocks a reader forever: 5 s tells that from any real work here."""
INPUT_FORMATS = ("cluster", "lab-spec", "profile", "hpp-plan", "psl-plan", "psl-spec")


def _fifo(where: Path) -> Path:
    os.mkfifo(where)
    return where


def _loop(where: Path) -> Path:
    where.symlink_to(where.name)
    return where


def _through_a_file(where: Path) -> Path:
    blocker = where.parent / f"file{where.suffix}"
    blocker.write_text("x")
    return blocker / where.name


def _long_name(where: Path) -> Path:
    return where.parent / ("n" * 300 + where.suffix)


def _folder(where: Path) -> Path:
    where.mkdir()
    return where


INPUTS = {"fifo": _fifo, "symlink-loop": _loop, "through-a-file": _through_a_file, "300-character-name": _long_name,
          "a-folder": _folder, "missing": lambda where: where}
INPUT_CASES = [(f, kind) for f in INPUT_FORMATS for kind in INPUTS if kind != "fifo" or f in ("cluster", "hpp-plan")]


@pytest.mark.parametrize("fmt_name, kind", INPUT_CASES, ids=[f"{f}-{k}" for f, k in INPUT_CASES])
def test_an_input_that_is_not_a_regular_file_is_refused(fmt_name, kind, tmp_path):
    fmt = FORMATS_BY_NAME[fmt_name]
    path = INPUTS[kind](tmp_path / f"input{fmt.seeds[0].suffix}")
    argv, outputs = fmt.commands[0](path, tmp_path)
    assert_contract(invoke(argv, bound_s=FIFO_BOUND_S if kind == "fifo" else 20), outputs, allowed={2})


def plan_out(out: Path):
    return ["plan", "--profile", TINY_PROFILE, "--global-batch", 64, "--micro-batch", 16, "--out", out]


def simulate_trace(out: Path):
    return ["simulate", "--plan", TINY_PLAN, "--trace", out]


def profile_out(out: Path):
    return ["profile", "--cluster", TINY_PROFILE.parent / "example.yaml", "--model", "tiny-cnn", "--out", out]


OUTPUT_COMMANDS = (plan_out, simulate_trace, profile_out)


@pytest.mark.parametrize("command", OUTPUT_COMMANDS, ids=[c.__name__ for c in OUTPUT_COMMANDS])
def test_an_output_symlink_never_replaces_or_writes_its_target(command, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "out.json"
    link.symlink_to(victim)
    outcome = invoke(command(link))
    assert_contract(outcome, allowed={2})
    assert victim.read_text() == "precious\n" and link.is_symlink(), outcome.describe()


@pytest.mark.parametrize("command", OUTPUT_COMMANDS, ids=[c.__name__ for c in OUTPUT_COMMANDS])
def test_an_output_fifo_is_refused_not_replaced(command, tmp_path):
    fifo = _fifo(tmp_path / "out.json")
    outcome = invoke(command(fifo), bound_s=FIFO_BOUND_S)
    assert_contract(outcome, allowed={2})
    assert fifo.is_fifo(), outcome.describe()
