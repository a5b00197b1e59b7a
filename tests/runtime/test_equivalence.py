"""Tier 2 (gloo): parameters after 5 rounds of `hppctl run` equal a single-process reference.

Workers are real local subprocesses started by the runtime's own launcher (the `hppctl run` path),
talking gloo on localhost; the reference is the plain PyTorch loop on the same global batches
(tests/runtime/reference.py). Models are tiny so that every case takes seconds.
"""

from __future__ import annotations

import pytest
import torch

from hppctl.runtime.config import TrainOptions
from hppctl.runtime.session import RunRequest, Session
from tests.runtime.factories import local_cluster, make_plan
from tests.runtime.reference import train_reference, train_sharded_reference

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]

ROUNDS = 5


def run_plan(plan, **options):
    opts = TrainOptions(rounds=ROUNDS, threads=1, **options)
    result = Session(RunRequest(plan, local_cluster(*plan.devices()), opts)).run()
    return result, opts


def assert_same(actual: dict, expected: dict, rtol: float = 1e-4, atol: float = 1e-6) -> None:
    assert sorted(actual) == sorted(expected)
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


# (layers, devices, samples) from head to tail; tiny-mlp has 5 fine layers.
CASES = {
    "one stage, one device": [((0, 5), ["a"], [4])],
    "two stages": [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])],
    "three stages, head replicated 3:1": [((0, 2), ["a", "b"], [3, 1]), ((2, 4), ["c"], [4]), ((4, 5), ["d"], [4])],
    "two stages, tail replicated 1:3": [((0, 3), ["a"], [4]), ((3, 5), ["b", "c"], [1, 3])],
}


@pytest.mark.parametrize("name", list(CASES))
def test_hpp_equals_single_process(name):
    plan = make_plan("tiny-mlp", CASES[name], global_batch=16, micro_batch=4)
    result, opts = run_plan(plan, dataset="synthetic", lr=0.1)
    assert [row["round"] for row in result.rounds] == list(range(ROUNDS))
    assert_same(result.model_state(), train_reference(plan, opts))


def test_warmup_and_cosine_schedule():
    plan = make_plan("tiny-mlp", CASES["three stages, head replicated 3:1"], global_batch=16, micro_batch=4)
    result, opts = run_plan(plan, dataset="synthetic", lr=0.1, lr_schedule="cosine", warmup_rounds=2)
    assert [row["lr"] for row in result.rounds] == [opts.learning_rate(r) for r in range(ROUNDS)]
    assert [row["lr"] for row in result.rounds] == pytest.approx([0.05, 0.1, 0.1, 0.075, 0.025])
    assert_same(result.model_state(), train_reference(plan, opts))


def test_adam_three_stages_uneven():
    plan = make_plan("tiny-mlp", [((0, 1), ["a"], [6]), ((1, 3), ["b", "c"], [2, 4]), ((3, 5), ["d"], [6])],
                     global_batch=24, micro_batch=6)
    result, opts = run_plan(plan, dataset="digits", optimizer="adam", lr=0.01)
    assert_same(result.model_state(), train_reference(plan, opts))
