"""Tier 2 (gloo): accelerators and precision through real `hppctl run` workers, on the CPU.

- A cluster file that says `accelerator: cpu` for every device trains exactly (torch.equal) what
  the same file without the field trains: the accelerator plumbing (to_wire/from_wire, the bound
  executor, fp32 without autocast) changes nothing on the CPU.
- `--precision bf16` and `fp16` on two stages (CPU autocast: real bf16/fp16 kernels) learn, and end
  within 5 % (relative norm, per tensor) of the fp32 run's parameters; measured on this machine
  2026-11-26 with 30 rounds of digits: bf16 1.96 %, fp16 2.23 % (the largest tensor's difference).

What these do not show: anything on CUDA (this machine has none; bench/gpu_smoke.py is the check).
"""

from __future__ import annotations

import pytest
import torch

from hppctl.models.cluster import ClusterSpec, DeviceSpec
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.session import RunRequest, Session
from tests.runtime.factories import local_cluster, make_plan

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]

TAIL_REPLICATED = [((0, 2), ["a"], [8]), ((2, 5), ["b", "c"], [4, 4])]
TWO_STAGES = [((0, 2), ["a"], [8]), ((2, 5), ["b"], [8])]
PRECISION_ROUNDS = 30
RELATIVE_TOLERANCE = 0.05


def train(plan, cluster, **options):
    opts = TrainOptions(threads=1, **options)
    return Session(RunRequest(plan, cluster, opts)).run()


def test_explicit_cpu_accelerator_trains_bit_identically_to_the_default():
    plan = make_plan("tiny-mlp", TAIL_REPLICATED, global_batch=16, micro_batch=8)
    explicit = ClusterSpec(name="local", devices=[DeviceSpec(name=n, local=True, accelerator="cpu")
                                                  for n in plan.devices()])
    default = train(plan, local_cluster(*plan.devices()), rounds=5, dataset="digits", lr=0.1)
    chosen = train(plan, explicit, rounds=5, dataset="digits", lr=0.1)
    expected, actual = default.model_state(), chosen.model_state()
    assert sorted(actual) == sorted(expected)
    assert all(torch.equal(actual[k], expected[k]) for k in expected)
    assert [r["loss"] for r in chosen.rounds] == [r["loss"] for r in default.rounds]


@pytest.fixture(scope="module")
def fp32_run():
    plan = make_plan("tiny-mlp", TWO_STAGES, global_batch=32, micro_batch=8)
    return plan, train(plan, local_cluster("a", "b"), rounds=PRECISION_ROUNDS, dataset="digits", lr=0.1)


def relative_differences(actual: dict, expected: dict) -> dict[str, float]:
    return {k: float((actual[k] - expected[k]).norm() / expected[k].norm()) for k in expected
            if expected[k].is_floating_point()}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_on_two_stages_learns_and_stays_close_to_fp32(fp32_run, precision):
    plan, reference = fp32_run
    run = train(plan, local_cluster("a", "b"), rounds=PRECISION_ROUNDS, dataset="digits", lr=0.1, precision=precision)
    losses = [r["loss"] for r in run.rounds]
    assert sum(losses[-3:]) < 0.6 * sum(losses[:3]), losses
    state, expected = run.model_state(), reference.model_state()
    differences = relative_differences(state, expected)
    assert max(differences.values()) < RELATIVE_TOLERANCE, differences
    assert max(differences.values()) > 0, "autocast did nothing: the run equals fp32 exactly"
