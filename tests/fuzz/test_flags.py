"""Every numeric flag of every command, given each hostile number: the bad-input contract holds.

Each flag is tried on a command line that is otherwise valid (the seeds of targets.py), so a value
the command accepts goes on to the gate (gates.py) and exits 0; any other value must be refused
with one line and exit 2. Flags whose value is a string holding numbers (`--fail DEVICE@S`,
`--cut A,B`, `--listen HOST:PORT`, …) get the numbers inside the string.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fuzz.harness import assert_contract, invoke
from tests.fuzz.targets import (GALAXY_CLUSTER, INFERENCE_PROFILE, LOCAL_CLUSTER, PSL_CLUSTER, SEEDS, TINY_PLAN,
                                TINY_PROFILE)

HOSTILE = ("nan", "inf", "-inf", "0", "-1", "1e400", "1e-300", "1" + "0" * 30)
REPO_CLUSTER = TINY_PROFILE.parent / "example.yaml"


def profile_measured(tmp):  # local: devices, so the measurement settings are read (the gate stops the measuring)
    return ["profile", "--cluster", LOCAL_CLUSTER, "--model", "tiny-cnn", "--out", tmp / "p.json"], (tmp / "p.json",)


def profile_inference(tmp):
    return (["profile", "--cluster", REPO_CLUSTER, "--model", "bert-small", "--seq-len", "32", "--out", tmp / "i.json"],
            (tmp / "i.json",))


def plan_training(tmp):
    return (["plan", "--profile", TINY_PROFILE, "--global-batch", "64", "--micro-batch", "16", "--out", tmp / "p.yaml"],
            (tmp / "p.yaml",))


def plan_inference(tmp):
    return ["plan", "--profile", INFERENCE_PROFILE, "--seq-len", "32", "--out", tmp / "g.yaml"], (tmp / "g.yaml",)


def simulate(tmp):
    return ["simulate", "--plan", TINY_PLAN, "--profile", TINY_PROFILE, "--trace", tmp / "t.json"], (tmp / "t.json",)


def simulate_fail(tmp):
    return ["simulate", "--plan", TINY_PLAN, "--profile", TINY_PROFILE, "--fail", "pi0@1", "--json"], ()


def run_training(tmp):
    return (["run", "--plan", TINY_PLAN, "--cluster", LOCAL_CLUSTER, "--rounds", "2", "--metrics", tmp / "m.jsonl"],
            (tmp / "m.jsonl",))


def run_with_recovery(tmp):
    return ["run", "--plan", TINY_PLAN, "--cluster", LOCAL_CLUSTER, "--profile", TINY_PROFILE, "--rounds", "2"], ()


def run_inference(tmp):
    return (["run", "--plan", SEEDS / "galaxy-plan.yaml", "--cluster", GALAXY_CLUSTER, "--output", tmp / "h.pt"],
            (tmp / "h.pt",))


def coordinator(tmp):
    return (["coordinator", "--plan", TINY_PLAN, "--cluster", LOCAL_CLUSTER, "--profile", TINY_PROFILE,
             "--events", tmp / "e.jsonl"], (tmp / "e.jsonl",))


def demo(tmp):
    return ["demo", "--out-dir", tmp / "demo", "--model", "tiny-cnn"], ()


def psl_plan_spec(tmp):
    return (["psl", "plan", "--spec", SEEDS / "psl-spec.yaml", "--method", "balanced-greedy", "--out", tmp / "psl.yaml"],
            (tmp / "psl.yaml",))


def psl_plan_profile(tmp):
    return (["psl", "plan", "--profile", TINY_PROFILE, "--clients", "pi0", "--helpers", "tx0", "--cut", "3,8",
             "--method", "balanced-greedy", "--out", tmp / "psl.yaml"], (tmp / "psl.yaml",))


def psl_simulate(tmp):
    return ["psl", "simulate", "--plan", SEEDS / "psl-plan.yaml", "--trace", tmp / "t.json"], (tmp / "t.json",)


def psl_run(tmp):
    return (["psl", "run", "--plan", SEEDS / "psl-plan.yaml", "--cluster", PSL_CLUSTER, "--metrics", tmp / "m.jsonl"],
            (tmp / "m.jsonl",))


@dataclass(frozen=True)
class Flag:
    base: object  # tmp -> (argv, outputs)
    flag: str
    template: str = "{}"
    """How the number is written into the flag's value (`pi0@{}` for --fail)."""
    extra: tuple = ()
    """Flags the one under test needs beside it."""

    @property
    def id(self) -> str:
        return f"{self.base.__name__}{self.flag}{'=' + self.template if self.template != '{}' else ''}"


FLAGS = (
    *(Flag(profile_measured, f) for f in ("--repeats", "--warmup", "--threads", "--timeout", "--link-seconds")),
    Flag(profile_measured, "--batch-sizes", "1,{}"),
    Flag(profile_inference, "--seq-len"), Flag(profile_inference, "--layers"),
    Flag(plan_training, "--global-batch"), Flag(plan_training, "--micro-batch"),
    Flag(plan_inference, "--seq-len"),
    Flag(simulate, "--step-time"), Flag(simulate, "--warmup", "{},1"),
    Flag(simulate_fail, "--fail", "pi0@{}"), Flag(simulate_fail, "--timeout"), Flag(simulate_fail, "--replicate-every"),
    *(Flag(run_training, f) for f in ("--rounds", "--seed", "--lr", "--warmup-rounds", "--bn-recalibrate",
                                      "--momentum", "--weight-decay", "--checkpoint-every", "--threads", "--timeout")),
    Flag(run_training, "--listen", "127.0.0.1:{}"),
    Flag(run_training, "--epochs", extra=("--rounds",)),  # replaces --rounds: the two exclude each other
    *(Flag(run_with_recovery, f) for f in ("--heartbeat", "--failure-timeout", "--probe-timeout", "--replicate-every")),
    *(Flag(run_inference, f) for f in ("--seq-len", "--repeat", "--warmup", "--threads", "--timeout")),
    *(Flag(coordinator, f) for f in ("--heartbeat", "--failure-timeout", "--timeout", "--probe-timeout", "--replicate-every", "--rounds",
                                     "--seed", "--lr", "--momentum", "--weight-decay")),
    Flag(coordinator, "--listen", "127.0.0.1:{}"),
    *(Flag(demo, f) for f in ("--global-batch", "--micro-batch", "--epochs", "--seed")),
    Flag(psl_plan_spec, "--slot"), Flag(psl_plan_spec, "--slot", "{}ms"), Flag(psl_plan_spec, "--target-slots"),
    Flag(psl_plan_spec, "--rho", extra=("--method", "admm")), Flag(psl_plan_spec, "--time-limit", extra=("--method", "exact")),
    Flag(psl_plan_spec, "--seed", extra=("--method", "random-fcfs")),
    Flag(psl_plan_profile, "--batch"), Flag(psl_plan_profile, "--cut", "{},8"),
    Flag(psl_simulate, "--slow", "lap={}"),
    *(Flag(psl_run, f) for f in ("--rounds", "--local-batches", "--seed", "--lr", "--momentum", "--weight-decay",
                                 "--threads", "--timeout")),
    Flag(psl_run, "--shares", "{},1,1"),
)


def with_flag(argv: list, flag: str, value: str, extra: tuple) -> list:
    """`argv` with `flag value` set (replacing a value it had), and `extra`: a flag to drop when it is
    alone (`("--rounds",)`), or a flag and its value to set."""
    argv = [str(a) for a in argv]

    def drop(name):
        if name in argv:
            i = argv.index(name)
            del argv[i:i + 2]

    drop(flag)
    if len(extra) == 1:
        drop(extra[0])
    elif extra:
        drop(extra[0])
        argv += list(extra)
    return argv + [flag, value]


CASES = [(f, v) for f in FLAGS for v in HOSTILE]


@pytest.mark.parametrize("case, value", CASES, ids=[f"{f.id}={v[:8]}" for f, v in CASES])
def test_a_hostile_number_in_a_flag_keeps_the_contract(case, value, tmp_path):
    argv, outputs = case.base(tmp_path)
    argv = with_flag(argv, case.flag, case.template.format(value), case.extra)
    assert_contract(invoke(argv), tuple(Path(p) for p in outputs))


BASES = sorted({f.base for f in FLAGS}, key=lambda b: b.__name__)


@pytest.mark.parametrize("base", BASES, ids=[b.__name__ for b in BASES])
def test_every_base_command_line_is_accepted(base, tmp_path):
    """The flags are fuzzed on valid command lines: each exits 0 unchanged."""
    argv, _ = base(tmp_path)
    assert_contract(invoke(argv), allowed={0})
