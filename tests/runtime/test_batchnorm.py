"""BatchNorm under micro-batching and replication (docs/runtime.md, "BatchNorm").

Each device normalises over the samples of its own forward call (its share of one micro-batch), as
a single process would if it ran the same pieces; a replicated stage averages its running
statistics over its devices (weighted by samples) at the AllReduce. So a BN model is compared with
the sharded reference, which runs exactly those pieces in one process. With one device and one
micro-batch per round the pieces are whole global batches, and the plain loop is the reference.
"""

from __future__ import annotations

import pytest

from tests.runtime.factories import make_plan
from tests.runtime.reference import train_reference, train_sharded_reference
from tests.runtime.test_equivalence import assert_same, run_plan

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]


def test_tiny_cnn_replicated_stage_matches_sharded_reference():
    # tiny-cnn has 11 fine layers; the cut after layer 4 is inside the residual block (skip + bn1 cross).
    plan = make_plan("tiny-cnn", [((0, 5), ["a", "b"], [3, 1]), ((5, 11), ["c"], [4])],
                     global_batch=16, micro_batch=4)
    result, opts = run_plan(plan, dataset="digits", lr=0.1)
    state = result.model_state()
    assert any(k.endswith("running_mean") for k in state)
    assert_same(state, train_sharded_reference(plan, opts))


def test_one_device_one_micro_batch_is_the_plain_loop():
    plan = make_plan("tiny-cnn", [((0, 11), ["a"], [16])], global_batch=16, micro_batch=16)
    result, opts = run_plan(plan, dataset="digits", lr=0.1)
    assert_same(result.model_state(), train_reference(plan, opts))
