"""Fixed cases, each the minimal form of a finding (issue 23's list, and what the fuzz suite found),
so that a fix stays fixed whatever examples Hypothesis draws.

Each test writes one valid seed file with one field changed and runs the command that read it
when the defect was found.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.fuzz.harness import assert_contract, invoke, invoke_subprocess
from tests.fuzz.targets import INFERENCE_PROFILE, LOCAL_CLUSTER, SEEDS, TINY_PLAN, TINY_PROFILE, read_seed

HUGE = 10**400
"""An integer no float can hold (`int too large to convert to float`)."""


def _write(path, doc) -> None:
    path.write_text(yaml.safe_dump(doc, sort_keys=False) if path.suffix != ".json" else json.dumps(doc))


def _changed(seed, tmp_path, change, suffix=None):
    """A copy of `seed` with `change(doc)` applied, written beside the test."""
    doc = read_seed(seed)
    change(doc)
    path = tmp_path / f"changed{suffix or seed.suffix}"
    _write(path, doc)
    return path


# --- numbers no float can hold, infinities (issue 23, item 7) ------------------------------------

@pytest.mark.parametrize("value", [HUGE, "1e400", float("inf")], ids=["10**400", "1e400", "inf"])
def test_a_cluster_memory_beyond_any_float_is_refused(tmp_path, value):
    cluster = _changed(TINY_PROFILE.parent / "example.yaml", tmp_path,
                       lambda d: d["devices"][2].update(memory=value))
    out = tmp_path / "p.json"
    assert_contract(invoke(["profile", "--cluster", cluster, "--model", "tiny-cnn", "--out", out]), (out,), allowed={2})


def test_an_infinite_cluster_bandwidth_is_refused(tmp_path):
    cluster = _changed(TINY_PROFILE.parent / "example.yaml", tmp_path, lambda d: d.update(bandwidth=float("inf")))
    out = tmp_path / "p.json"
    assert_contract(invoke(["profile", "--cluster", cluster, "--model", "tiny-cnn", "--out", out]), (out,), allowed={2})


@pytest.mark.parametrize("value", [HUGE, float("inf")], ids=["10**400", "inf"])
def test_a_profile_memory_beyond_any_float_is_refused(tmp_path, value):
    profile = _changed(TINY_PROFILE, tmp_path, lambda d: d["devices"][1].update(memory_bytes=value))
    out = tmp_path / "plan.yaml"
    assert_contract(invoke(["plan", "--profile", profile, "--global-batch", 64, "--micro-batch", 16, "--out", out]),
                    (out,), allowed={2})


@pytest.mark.parametrize("value", [HUGE, "1e400"], ids=["10**400", "1e400"])
def test_a_lab_host_memory_beyond_any_float_is_refused(tmp_path, value):
    spec = _changed(SEEDS / "lab-spec.yaml", tmp_path, lambda d: d["hosts"][2].update(memory=value))
    out = tmp_path / "lab.yaml"
    assert_contract(invoke(["lab", "up", "--spec", spec, "--state-dir", tmp_path / "state", "--out", out]), (out,),
                    allowed={2})


def test_a_psl_batch_beyond_any_float_is_refused(tmp_path):
    """Found by the fuzz suite: `batch: 10**400` in a psl spec was an OverflowError traceback."""
    spec = _changed(SEEDS / "psl-spec.yaml", tmp_path, lambda d: d.update(batch=HUGE))
    out = tmp_path / "psl.yaml"
    assert_contract(invoke(["psl", "plan", "--spec", spec, "--method", "balanced-greedy", "--out", out]), (out,),
                    allowed={2, 3})


def test_an_infinite_stage_time_is_blamed_on_the_plan(tmp_path):
    """Issue 23, item 7: a stage `forward_s: .inf` was blamed on --policy."""
    plan = _changed(TINY_PLAN, tmp_path, lambda d: d["stages"][0].update(forward_s=float("inf")))
    outcome = invoke(["simulate", "--plan", plan, "--json"])
    assert_contract(outcome, allowed={2})
    assert "--policy" not in outcome.stderr and str(plan) in outcome.stderr, outcome.describe()


# --- tampered plans that keep their digest (issue 23, item 7) -------------------------------------

def _past_the_model(doc) -> None:
    doc["stages"][-1]["layers"][1] = 40


def _unknown_device(doc) -> None:
    doc["stages"][0]["devices"] = ["ghost"]


TAMPERED = {"layer-range-past-the-model": _past_the_model, "unknown-device": _unknown_device}


@pytest.mark.parametrize("tamper", sorted(TAMPERED))
@pytest.mark.parametrize("command", ["rescore", "simulate"])
def test_a_tampered_plan_is_refused(tmp_path, tamper, command):
    plan = _changed(TINY_PLAN, tmp_path, TAMPERED[tamper])
    argv = (["plan", "--profile", TINY_PROFILE, "--plan", plan, "--explain"] if command == "rescore"
            else ["simulate", "--plan", plan, "--profile", TINY_PROFILE])
    assert_contract(invoke(argv), allowed={2})


# --- flags that did nothing or reached the worker (issue 23, item 7) ------------------------------

def test_input_ids_on_a_training_plan_are_refused(tmp_path):
    ids = tmp_path / "ids.json"
    ids.write_text("[1, 2, 3]")
    assert_contract(invoke(["run", "--plan", TINY_PLAN, "--cluster", LOCAL_CLUSTER, "--rounds", 1,
                            "--input-ids", ids]), allowed={2})


def test_a_dataset_factory_outside_the_data_is_refused():
    assert_contract(invoke(["run", "--plan", TINY_PLAN, "--cluster", LOCAL_CLUSTER, "--rounds", 1,
                            "--dataset", "os:system"]), allowed={2})


def test_a_billion_threads_is_refused_before_the_workers(tmp_path):
    """Issue 23, item 7: `--threads 1e9` failed in the worker. A real run (no gate): refused, or it works."""
    outcome = invoke_subprocess(["run", "--plan", TINY_PLAN, "--cluster", LOCAL_CLUSTER, "--rounds", 1,
                                 "--threads", 10**9], gated=False, cwd=tmp_path)
    assert_contract(outcome, allowed={0, 2})


def test_plan_on_an_inference_profile_does_not_ignore_plan(tmp_path):
    """Found by the fuzz suite: `plan --profile INFERENCE --plan FILE` planned afresh and exited 0,
    whatever FILE was (even a missing one): --plan was silently ignored."""
    outcome = invoke(["plan", "--profile", INFERENCE_PROFILE, "--plan", tmp_path / "missing.yaml", "--json"])
    assert_contract(outcome, allowed={2})


# --- sizes that hang (issue 23, item 8): refused within the bound, one line ------------------------
# Real processes: a hang inside numpy or a C loop does not see the in-process alarm, a kill does.

SIZE_BOUND_S = 20


def _within_bound(argv, outputs=(), allowed=frozenset({2})) -> None:
    assert_contract(invoke_subprocess(argv, bound_s=SIZE_BOUND_S), outputs, allowed=set(allowed))


def test_a_million_psl_clients_are_refused(tmp_path):
    spec = _changed(SEEDS / "psl-spec.yaml", tmp_path, lambda d: d["clients"][0].update(count=1_000_000))
    out = tmp_path / "psl.yaml"
    _within_bound(["psl", "plan", "--spec", spec, "--method", "balanced-greedy", "--out", out], (out,))


def test_a_picosecond_psl_slot_is_refused(tmp_path):
    spec = _changed(SEEDS / "psl-spec.yaml", tmp_path, lambda d: d.update(slot="1e-12"))
    out = tmp_path / "psl.yaml"
    _within_bound(["psl", "plan", "--spec", spec, "--method", "admm", "--out", out], (out,))


def test_a_plan_of_a_million_micro_batches_is_refused(tmp_path):
    def million(doc):
        doc.update(global_batch=16 * 10**6, num_micro_batches=10**6)

    _within_bound(["simulate", "--plan", _changed(TINY_PLAN, tmp_path, million), "--json"])


def test_a_million_micro_batches_are_refused_when_planning(tmp_path):
    """Planned in 0.8 s with --json; the human output ran the nf1b report for 62 s (issue 23, item 8)."""
    out = tmp_path / "plan.yaml"
    _within_bound(["plan", "--profile", TINY_PROFILE, "--global-batch", 10**6, "--micro-batch", 1, "--out", out],
                  (out,), allowed={0, 2})
