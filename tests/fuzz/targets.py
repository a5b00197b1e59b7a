"""Every file format hppctl reads, the valid files it is fuzzed from, and the commands that read it.

Seeds are the real example files of the repository (profiles/, plans/) and, for the kinds the
repository ships none of, small files made with hppctl itself and kept in tests/fuzz/seeds/
(the lab spec is docs/lab.md's). A command is a function of (the fuzzed file, a scratch folder)
returning the argv and the output paths that must not exist after a failure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from tests.fuzz.harness import REPO

SEEDS = REPO / "tests" / "fuzz" / "seeds"
TINY_PROFILE = REPO / "profiles" / "example-tiny.json"
TINY_PLAN = REPO / "plans" / "example-tiny.yaml"
LOCAL_CLUSTER = SEEDS / "local-cluster.yaml"
GALAXY_CLUSTER = SEEDS / "galaxy-local-cluster.yaml"
PSL_CLUSTER = SEEDS / "psl-local-cluster.yaml"
INFERENCE_PROFILE = SEEDS / "inference-profile.json"

Command = Callable[[Path, Path], tuple[list, tuple[Path, ...]]]


def read_seed(path: Path) -> dict:
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def fmt_of(path: Path) -> str:
    return "json" if path.suffix == ".json" else "yaml"


# --- the commands, one per way a file is read --------------------------------------------------

def profile_from_cluster(f: Path, tmp: Path):
    out = tmp / "out" / "profile.json"
    return ["profile", "--cluster", f, "--model", "tiny-cnn", "--out", out], (out,)


def run_on_cluster(f: Path, tmp: Path):
    return ["run", "--plan", TINY_PLAN, "--cluster", f, "--rounds", 1], ()


def lab_up_validate(f: Path, tmp: Path):
    out = tmp / "out" / "lab-cluster.yaml"
    return ["lab", "up", "--spec", f, "--state-dir", tmp / "lab-state", "--out", out], (out, tmp / "lab-state")


def plan_from_profile(f: Path, tmp: Path):
    out = tmp / "out" / "plan.yaml"
    return ["plan", "--profile", f, "--global-batch", 64, "--micro-batch", 16, "--out", out], (out,)


def plan_compare_from_profile(f: Path, tmp: Path):
    return ["plan", "--profile", f, "--global-batch", 64, "--micro-batch", 16, "--compare", "--json"], ()


def galaxy_plan_from_profile(f: Path, tmp: Path):
    out = tmp / "out" / "galaxy.yaml"
    return ["plan", "--profile", f, "--strategy", "galaxy", "--seq-len", 32, "--out", out], (out,)


def rescore_plan(f: Path, tmp: Path):
    return ["plan", "--profile", TINY_PROFILE, "--plan", f, "--explain", "--json"], ()


def simulate_plan(f: Path, tmp: Path):
    trace = tmp / "out" / "trace.json"
    return ["simulate", "--plan", f, "--profile", TINY_PROFILE, "--trace", trace], (trace,)


def simulate_plan_alone(f: Path, tmp: Path):
    schedule = tmp / "out" / "schedule.json"
    return ["simulate", "--plan", f, "--write-schedule", schedule, "--json"], (schedule,)


def simulate_nf1b(f: Path, tmp: Path):
    return ["simulate", "--plan", f, "--policy", "nf1b", "--json"], ()


def run_plan(f: Path, tmp: Path):
    metrics = tmp / "out" / "metrics.jsonl"
    return ["run", "--plan", f, "--cluster", LOCAL_CLUSTER, "--rounds", 1, "--metrics", metrics], (metrics,)


def run_nf1b(f: Path, tmp: Path):
    return ["run", "--plan", f, "--cluster", LOCAL_CLUSTER, "--schedule", "nf1b", "--epochs", 1], ()


def run_galaxy_plan(f: Path, tmp: Path):
    output = tmp / "out" / "hidden.pt"
    return ["run", "--plan", f, "--cluster", GALAXY_CLUSTER, "--output", output], (output,)


def psl_simulate(f: Path, tmp: Path):
    trace = tmp / "out" / "psl-trace.json"
    return ["psl", "simulate", "--plan", f, "--trace", trace], (trace,)


def psl_run(f: Path, tmp: Path):
    metrics = tmp / "out" / "psl-metrics.jsonl"
    return ["psl", "run", "--plan", f, "--cluster", PSL_CLUSTER, "--metrics", metrics], (metrics,)


def psl_plan_from_spec(f: Path, tmp: Path):
    out = tmp / "out" / "psl-plan.yaml"
    return ["psl", "plan", "--spec", f, "--method", "balanced-greedy", "--out", out], (out,)


@dataclass(frozen=True)
class Format:
    name: str
    seeds: tuple[Path, ...]
    commands: tuple[Command, ...]


CLUSTER_SEEDS = tuple(sorted((REPO / "profiles").glob("*.yaml")))

FORMATS = (
    Format("cluster", CLUSTER_SEEDS, (profile_from_cluster,)),
    Format("local-cluster", (LOCAL_CLUSTER,), (run_on_cluster,)),
    Format("lab-spec", (SEEDS / "lab-spec.yaml",), (lab_up_validate,)),
    Format("profile", (TINY_PROFILE,), (plan_from_profile, plan_compare_from_profile)),
    Format("inference-profile", (INFERENCE_PROFILE,), (galaxy_plan_from_profile,)),
    Format("hpp-plan", (TINY_PLAN,), (rescore_plan, simulate_plan, simulate_plan_alone, run_plan)),
    Format("bipartition-plan", (SEEDS / "bipartition-plan.yaml",), (rescore_plan, simulate_plan, run_plan)),
    Format("nf1b-plan", (SEEDS / "pp-plan.yaml",), (simulate_nf1b, run_nf1b)),
    Format("galaxy-plan", (SEEDS / "galaxy-plan.yaml",), (run_galaxy_plan,)),
    Format("psl-plan", (SEEDS / "psl-plan.yaml",), (psl_simulate, psl_run)),
    Format("psl-spec", (SEEDS / "psl-spec.yaml",), (psl_plan_from_spec,)),
)
FORMATS_BY_NAME = {f.name: f for f in FORMATS}
