"""Tier 2 (gloo): `hppctl run`'s workers execute split backwards (`I`, `W`) and train exactly as `B`.

Real worker processes run generated schedules in which every `B` became an `I` and a `W` later on
the same device (tests/runtime/split_schedules.py: before the device's next `F`, or all before
`AR`/`STEP`); the parameters after the run equal the single-process reference. On replicated
stages the AllReduce still starts within the device's last backward, now its last `W`: the
reducer's post-accumulate-grad hooks fire because `W` accumulates through autograd.
"""

from __future__ import annotations

import pytest

from hppctl.runtime.config import TrainOptions
from hppctl.runtime.session import RunRequest, Session
from hppctl.schedule import schedule_for_plan
from tests.runtime.factories import local_cluster, make_plan
from tests.runtime.reference import train_reference, train_sharded_reference
from tests.runtime.split_schedules import PLACEMENTS, split_backwards
from tests.runtime.test_allreduce_overlap import device_spans
from tests.runtime.test_equivalence import assert_same

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]

ROUNDS = 3


def run_split(plan, placement: str, **options):
    opts = TrainOptions(rounds=ROUNDS, threads=1, dataset="synthetic", lr=0.1, **options)
    schedule = split_backwards(schedule_for_plan(plan), placement)
    assert not any(a.kind == "B" for actions in schedule.actions.values() for a in actions)
    result = Session(RunRequest(plan, local_cluster(*plan.devices()), opts, schedule=schedule)).run()
    assert [row["round"] for row in result.rounds] == list(range(ROUNDS))
    return result, opts


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_split_backwards_equal_the_single_process_reference(placement):
    plan = make_plan("tiny-mlp", [((0, 2), ["a", "b"], [3, 1]), ((2, 4), ["c"], [4]), ((4, 5), ["d", "e"], [1, 3])],
                     global_batch=16, micro_batch=4)
    result, opts = run_split(plan, placement)
    assert_same(result.model_state(), train_reference(plan, opts))


def test_batchnorm_model_with_a_replicated_stage():
    """tiny-cnn (BatchNorm, a residual block): `I` returns BatchNorm's weight gradients, `W` adds them."""
    plan = make_plan("tiny-cnn", [((0, 5), ["a"], [4]), ((5, 11), ["b", "c"], [2, 2])], global_batch=16, micro_batch=4)
    result, opts = run_split(plan, "before next F")
    assert_same(result.model_state(), train_sharded_reference(plan, opts))


def test_allreduce_starts_within_the_last_weight_half():
    """As tests/runtime/test_allreduce_overlap.py with `B` split: one parameter per bucket, bucket 0
    starts before the device's last `W` of the round ends, and the sums are exact."""
    plan = make_plan("tiny-mlp", [((0, 2), ["a", "b"], [3, 1]), ((2, 5), ["c", "d"], [4, 0])],
                     global_batch=16, micro_batch=4)
    result, opts = run_split(plan, "before AR", trace=True, allreduce_bucket_bytes=1)
    assert_same(result.model_state(), train_reference(plan, opts))
    spans = device_spans(result.trace)
    for device, params in (("a", 2), ("c", 4)):
        buckets = [e for e in spans[f"{device}: AllReduce buckets"] if e["cat"] == "allreduce"]
        assert len(buckets) == ROUNDS * params
        weight_halves = sorted((e for track, es in spans.items() if track.startswith("stage") and f": {device} (" in track
                                for e in es if e["cat"] == "backward" and "W" in e["name"]), key=lambda e: e["ts"])
        assert len(weight_halves) == ROUNDS * 4
        for r in range(ROUNDS):
            last_w = weight_halves[4 * r + 3]
            first_bucket = min(buckets[r * params:(r + 1) * params], key=lambda e: e["ts"])
            assert first_bucket["name"].endswith("bucket 0")
            assert last_w["ts"] < first_bucket["ts"] < last_w["ts"] + last_w["dur"], (device, r)
    assert [e["name"] for e in spans["d: AllReduce buckets"]] == [e["name"] for e in spans["c: AllReduce buckets"]]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_split_equals_unsplit(precision):
    """Autocast and fp16's loss scale: the split run ends with the parameters of the same run with `B`."""
    plan = make_plan("tiny-cnn", [((0, 5), ["a"], [4]), ((5, 11), ["b", "c"], [2, 2])], global_batch=16, micro_batch=4)
    split, opts = run_split(plan, "before next F", precision=precision)
    whole = Session(RunRequest(plan, local_cluster(*plan.devices()), opts)).run()
    assert_same(split.model_state(), whole.model_state())


def split_plan(plan):
    """`plan` with `split_backward` (and the weight-gradient share its stages then need: half)."""
    doc = plan.model_dump()
    doc["split_backward"] = True
    for stage in doc["stages"]:
        stage["weight_grad_s"] = stage["backward_s"] / 2
    return type(plan).model_validate(doc)


def test_the_generators_split_schedule():
    """A plan with `split_backward`: `hppctl run`'s own schedule (the generator's `I`/`W` placement)."""
    plan = split_plan(make_plan("tiny-mlp", [((0, 2), ["a", "b"], [3, 1]), ((2, 4), ["c"], [4]), ((4, 5), ["d"], [4])],
                                global_batch=16, micro_batch=4))
    kinds = {a.kind for actions in schedule_for_plan(plan).actions.values() for a in actions}
    assert {"I", "W"} <= kinds and "B" not in kinds
    opts = TrainOptions(rounds=ROUNDS, threads=1, dataset="synthetic", lr=0.1)
    result = Session(RunRequest(plan, local_cluster(*plan.devices()), opts)).run()
    assert_same(result.model_state(), train_reference(plan, opts))
