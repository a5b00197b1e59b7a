"""Which plan `--resume` continues on (pure: checkpoint.plan_to_resume over COMPLETE.json records)."""

from __future__ import annotations

import pytest

from hppctl.errors import BadInput
from hppctl.runtime.checkpoint import CheckpointDir, plan_to_resume
from hppctl.runtime.session import Lineage, plan_digest, plan_document
from tests.runtime.factories import make_plan

ORIGINAL = make_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 4), ["b"], [4]), ((4, 5), ["c"], [4])],
                     global_batch=16, micro_batch=4)
REPLANNED = make_plan("tiny-mlp", [((0, 3), ["a"], [4]), ((3, 5), ["c"], [4])], global_batch=16, micro_batch=4)
OTHER = make_plan("tiny-mlp", [((0, 1), ["a"], [4]), ((1, 5), ["b"], [4])], global_batch=32, micro_batch=4)


def meta(plan, origin=None, lost=()):
    return {"plan": plan_document(plan), "origin_plan": origin or plan_digest(plan), "lost": list(lost)}


def test_no_checkpoint_or_the_same_plan_resumes_on_the_plan_given():
    assert plan_to_resume(None, ORIGINAL) == (ORIGINAL, Lineage(origin=plan_digest(ORIGINAL)))
    assert plan_to_resume(meta(ORIGINAL), ORIGINAL) == (ORIGINAL, Lineage(origin=plan_digest(ORIGINAL)))


def test_the_plan_a_run_started_with_resumes_on_the_plan_fault_tolerance_made():
    record = meta(REPLANNED, origin=plan_digest(ORIGINAL), lost=["b"])
    plan, lineage = plan_to_resume(record, ORIGINAL)
    assert plan_document(plan) == plan_document(REPLANNED)
    assert lineage == Lineage(origin=plan_digest(ORIGINAL), lost=("b",))


def test_the_replanned_plan_itself_keeps_the_lineage():
    # so that a later --resume with the first plan still finds its way
    record = meta(REPLANNED, origin=plan_digest(ORIGINAL), lost=["b"])
    assert plan_to_resume(record, REPLANNED) == (REPLANNED, Lineage(origin=plan_digest(ORIGINAL), lost=("b",)))


def test_an_unrelated_plan_is_left_for_the_checkpoint_to_refuse(tmp_path):
    record = meta(REPLANNED, origin=plan_digest(ORIGINAL), lost=["b"])
    assert plan_to_resume(record, OTHER) == (OTHER, Lineage(origin=plan_digest(OTHER)))
    ck = CheckpointDir(tmp_path)
    ck.write_round(3, {0: b"x", 1: b"y"}, {**record, "seed": 0})
    with pytest.raises(BadInput) as refused:
        ck.latest({"plan": plan_document(OTHER), "seed": 0})
    message = str(refused.value)
    # it used to print both plans' JSON whole
    assert "written by another plan (tiny-mlp: [0, 3) a | [3, 5) c), this run's is tiny-mlp: [0, 1) a | [1, 5) b" in message
    assert "its global_batch is 16 where this run's is 32" in message
    assert len(message) < 500


@pytest.mark.parametrize("change, reason", [
    ({"global_batch": 32}, "its global_batch is 16 where this run's is 32"),
    ({"model": "tiny-cnn"}, "its model is 'tiny-mlp' where this run's is 'tiny-cnn'"),
    ({"granularity": "block"}, "its granularity is 'fine'"),
])
def test_only_plans_of_the_same_model_granularity_and_global_batch_are_recut(change, reason):
    from hppctl.runtime.checkpoint import why_not_recut

    assert why_not_recut(plan_document(ORIGINAL), plan_document(REPLANNED)) is None
    assert reason in why_not_recut(plan_document(ORIGINAL), {**plan_document(REPLANNED), **change})
    bipartite = plan_document(REPLANNED)  # Bi-Partition stages re-cut too (tests/bipartition/test_checkpoint.py)
    bipartite["stages"][0]["backward_layers"] = [0, 2]
    assert why_not_recut(plan_document(ORIGINAL), bipartite) is None


def test_checkpoints_written_before_lineage_existed_still_resume():
    record = {"plan": plan_document(ORIGINAL)}
    assert plan_to_resume(record, ORIGINAL) == (ORIGINAL, Lineage(origin=plan_digest(ORIGINAL)))


def test_the_digest_ignores_planning_time():
    assert plan_digest(ORIGINAL) == plan_digest(ORIGINAL.model_copy(update={"planning_time_s": 9.0}))
    assert plan_digest(ORIGINAL) != plan_digest(REPLANNED)


@pytest.mark.parametrize("written, resumed, accepted", [
    (dict(), dict(), True),
    (dict(lr_schedule="cosine", rounds=20), dict(lr_schedule="cosine", rounds=20), True),
    (dict(lr_schedule="cosine", rounds=20), dict(), False),
    (dict(), dict(lr_schedule="cosine", rounds=20), False),
    (dict(lr_schedule="cosine", rounds=20), dict(lr_schedule="cosine", rounds=40), False),  # the decay would jump back up
    (dict(warmup_rounds=3), dict(warmup_rounds=3, rounds=50), True),  # a constant rate may be extended
    (dict(warmup_rounds=3), dict(), False),
])
def test_resume_needs_the_learning_rate_schedule_it_was_trained_with(tmp_path, written, resumed, accepted):
    from hppctl.runtime.config import TrainOptions
    from hppctl.runtime.session import run_fingerprint

    ck = CheckpointDir(tmp_path / "ck")
    ck.write_round(4, {0: b"0", 1: b"1", 2: b"2"},
                   {**run_fingerprint(ORIGINAL, TrainOptions(**{"rounds": 20, **written})), "stages": [0, 1, 2]})
    expected = run_fingerprint(ORIGINAL, TrainOptions(**{"rounds": 20, **resumed}))
    if accepted:
        assert ck.latest(expected)[0] == 4
    else:
        with pytest.raises(BadInput, match="lr_schedule is .*, this run has"):
            ck.latest(expected)


def test_a_checkpoint_from_before_schedules_resumes_a_constant_rate(tmp_path):
    from hppctl.runtime.config import TrainOptions
    from hppctl.runtime.session import run_fingerprint

    old = run_fingerprint(ORIGINAL, TrainOptions(rounds=20))
    del old["lr_schedule"]
    ck = CheckpointDir(tmp_path / "ck")
    ck.write_round(4, {0: b"0", 1: b"1", 2: b"2"}, {**old, "stages": [0, 1, 2]})
    assert ck.latest(run_fingerprint(ORIGINAL, TrainOptions(rounds=20)))[0] == 4
