"""What Bi-Partition runs cannot do yet is refused by name, exit 2, before any worker starts (issue 24
item 3; docs/bipartition.md, "Limits").

Before: `--replan` (on by default with `--profile`) and `hppctl coordinator` started the workers,
which failed on the split actions (exit 1); `--schedule nf1b` trained the forward cuts alone as
layer-wise stages (exit 0). (`--resume` and `--checkpoint-dir` were refused here too until they
worked: tests/bipartition/test_checkpoint.py.)
"""

from __future__ import annotations

import importlib

import pytest

from hppctl.models.cluster import ClusterSpec, DeviceSpec
from hppctl.profiling.from_presets import build_preset_profile
from hppctl.store import save
from hppctl.zoo import layer_costs
from tests.bipartition.factories import bi_plan

DEVICES = ["a", "b", "c"]
WHAT = "is a Bi-Partition plan (stage 0 forwards [0, 3) and backwards [0, 2))"


class WorkersStarted(Exception):
    """Raised instead of training: the command got past its checks."""


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A Bi-Partition plan of tiny-mlp, its profile, a local cluster; training is stubbed out."""

    def started(*args, **kwargs):
        raise WorkersStarted

    monkeypatch.setattr(importlib.import_module("hppctl.driver"), "train", started)
    presets = ClusterSpec(name="nanos", devices=[DeviceSpec(name=d, preset="jetson-nano") for d in DEVICES + ["d"]])
    profile = build_preset_profile(presets, layer_costs("tiny-mlp", "fine"), model="tiny-mlp", granularity="fine",
                                   batch_sizes=[1, 2, 4, 8, 16])
    plan = bi_plan("tiny-mlp", [0, 3, 4, 5], [0, 2, 5, 5], DEVICES, global_batch=16, micro_batch=4)
    plan = plan.model_copy(update={"profile_digest": profile.digest()})
    paths = {name: tmp_path / name for name in ("plan.yaml", "profile.json", "cluster.yaml", "ck")}
    save(paths["plan.yaml"], plan)
    save(paths["profile.json"], profile)
    save(paths["cluster.yaml"], ClusterSpec(name="local", devices=[DeviceSpec(name=d, local=True)
                                                                   for d in DEVICES + ["d"]]))
    return paths, plan


def run_args(paths, *extra) -> list:
    return ["run", "--plan", paths["plan.yaml"], "--cluster", paths["cluster.yaml"], "--rounds", 2, *extra]


def refused(cli, argv, flag: str, plan_file) -> str:
    code, out, err = cli(*argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, (code, err)
    assert lines[0].startswith(f"error: {flag}: {plan_file} {WHAT}"), lines[0]
    assert 'docs/bipartition.md, "Limits"' in lines[0]
    return lines[0]


def test_run_refuses_fault_tolerance(cli, files):
    paths, _ = files
    line = refused(cli, run_args(paths, "--profile", paths["profile.json"]), "--replan", paths["plan.yaml"])
    assert "lost device" in line and "--replan off" in line
    refused(cli, run_args(paths, "--profile", paths["profile.json"], "--replan", "heavy"), "--replan",
            paths["plan.yaml"])
    with pytest.raises(WorkersStarted):  # what the refusal advises runs
        cli(*run_args(paths, "--profile", paths["profile.json"], "--replan", "off"))


def test_run_refuses_asynchronous_windows(cli, files):
    paths, _ = files
    argv = ["run", "--plan", paths["plan.yaml"], "--cluster", paths["cluster.yaml"], "--epochs", 1,
            "--schedule", "nf1b"]
    assert "would drop its backward ranges" in refused(cli, argv, "--schedule nf1b", paths["plan.yaml"])


def test_coordinator_refuses_a_bipartition_plan(cli, files):
    paths, _ = files
    argv = ["coordinator", "--plan", paths["plan.yaml"], "--cluster", paths["cluster.yaml"], "--profile",
            paths["profile.json"], "--rounds", 2]
    assert "`hppctl run` without --profile" in refused(cli, argv, "--replan", paths["plan.yaml"])


def test_a_replicated_bipartition_stage_is_refused_by_name(cli, files):
    paths, plan = files
    replicated = plan.stages[0].model_copy(update=dict(devices=["a", "d"], samples=[2, 2], memory_bytes=[0, 0],
                                                       memory_budget_bytes=[10**9] * 2))
    save(paths["plan.yaml"], plan.model_copy(update={"stages": [replicated, *plan.stages[1:]]}))
    for argv in (run_args(paths), run_args(paths, "--profile", paths["profile.json"], "--replan", "off")):
        code, _, err = cli(*argv)
        assert code == 2 and err.strip().splitlines() == [
            f"error: {paths['plan.yaml']}: stages.0.devices: a, d replicate a stage of a Bi-Partition plan (stage 0 "
            f"backwards other layers than it forwards), and Bi-Partition runs cannot replicate stages yet "
            f'(docs/bipartition.md, "Limits")']


def test_a_plan_of_a_bipartition_strategy_with_equal_cuts_is_not_refused(cli, files):
    """Only stages with a backward range of their own are Bi-Partition stages: equal cuts (what
    `layerwise`, and often `bipartition`, plan) run on the ordinary runtime, which can do all this."""
    paths, plan = files
    equal = bi_plan("tiny-mlp", [0, 2, 5], [0, 2, 5], ["a", "b"], global_batch=16, micro_batch=4)
    save(paths["plan.yaml"], equal.model_copy(update={"profile_digest": plan.profile_digest,
                                                      "strategy": "bipartition"}))
    with pytest.raises(WorkersStarted):
        cli(*run_args(paths, "--profile", paths["profile.json"], "--checkpoint-dir", paths["ck"]))
