"""Tier 2 (gloo): a plan of one micro-batch per round (M = 1), which `--micro-batch auto` chooses for
data parallelism (issue 28 item 2), trains exactly like the single-process reference: a replicated
stage (uneven 3:1 split, gradients averaged once per round) feeding a pipeline stage."""

from __future__ import annotations

import pytest

from hppctl.runtime.config import TrainOptions
from hppctl.runtime.session import RunRequest, Session
from tests.runtime.factories import local_cluster, make_plan
from tests.runtime.reference import train_reference
from tests.runtime.test_equivalence import assert_same

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]


def test_one_micro_batch_per_round_with_a_replicated_stage_equals_single_process():
    plan = make_plan("tiny-mlp", [((0, 2), ["a", "b"], [3, 1]), ((2, 5), ["c"], [4])], global_batch=4, micro_batch=4)
    assert plan.num_micro_batches == 1
    opts = TrainOptions(rounds=4, threads=1, dataset="synthetic", lr=0.1)
    result = Session(RunRequest(plan, local_cluster(*plan.devices()), opts)).run()
    assert [row["round"] for row in result.rounds] == [0, 1, 2, 3]
    assert_same(result.model_state(), train_reference(plan, opts))
