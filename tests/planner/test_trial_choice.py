"""`hppctl plan --trial`'s pure half: which candidates a trial trains, and the choice its measurements make.

The trial itself (real workers) is tests/runtime/test_plan_trial.py; here the measured figures are given,
so the rule can be checked exactly: the best *measured* candidate wins even where the simulator ranked
another first, ties to the smaller micro-batch, and the plan's record says so and validates.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hppctl.cli.plan import describe_choice
from hppctl.models.plan import MicroBatchCandidate, MicroBatchChoice
from hppctl.planner.micro_batch import trial_candidates, try_micro_batches, with_choice
from hppctl.schedule import simulated_round_latency
from tests.conftest import make_profile


@pytest.fixture(scope="module")
def tried():
    profile = make_profile(layers=8, speeds=(1, 1, 2))
    return try_micro_batches(profile, 64, "asteroid", simulated_round_latency(profile))


def test_trial_candidates_are_the_best_simulated_choosable_ones_best_first(tried):
    usable = [t for t in tried if t.skipped is None]
    short = trial_candidates(tried, 3)
    assert len(short) == 3
    scores = [t.simulated_throughput for t in short]
    assert scores == sorted(scores, reverse=True)
    assert min(scores) >= max(t.simulated_throughput for t in usable if t not in short)
    assert trial_candidates(tried, 100) == sorted(usable, key=lambda t: (-t.score, t.micro_batch))


def test_the_best_measured_candidate_wins_over_the_best_simulated(tried):
    first, second, third = trial_candidates(tried, 3)
    measured = {first.micro_batch: 100.0, second.micro_batch: 130.0, third.micro_batch: 90.0}
    plan = with_choice(tried, measured)
    choice = plan.micro_batch_choice
    assert plan.micro_batch == choice.chosen == second.micro_batch
    assert choice.ranked_by == "measured" and "measured on the cluster" in choice.rule
    figures = {c.micro_batch: c.measured_samples_per_s for c in choice.candidates}
    assert {b: v for b, v in figures.items() if v is not None} == measured
    assert all(c.simulated_samples_per_s is not None for c in choice.candidates if c.skipped is None)
    assert MicroBatchChoice.model_validate(choice.model_dump())  # round-trips through the file format
    line = describe_choice(choice)
    assert line.startswith(f"micro-batch {second.micro_batch} (auto: best measured on the cluster of ")
    assert f"130.0 vs 100.0 samples/s at {first.micro_batch}, the next best" in line


def test_a_measured_tie_goes_to_the_smaller_micro_batch(tried):
    first, second = trial_candidates(tried, 2)
    plan = with_choice(tried, {first.micro_batch: 50.0, second.micro_batch: 50.0})
    assert plan.micro_batch == min(first.micro_batch, second.micro_batch)


def test_a_record_whose_chosen_is_not_the_best_measured_is_refused(tried):
    first, second = trial_candidates(tried, 2)
    choice = with_choice(tried, {first.micro_batch: 100.0, second.micro_batch: 130.0}).micro_batch_choice
    with pytest.raises(ValidationError, match="is not the candidate with the highest throughput"):
        MicroBatchChoice.model_validate({**choice.model_dump(), "chosen": first.micro_batch})
    with pytest.raises(ValidationError, match="a skipped candidate has no"):  # nothing ran: nothing measured
        MicroBatchCandidate(micro_batch=4, skipped="does not fit", measured_samples_per_s=1.0)


def test_passes_alternate_direction_so_drift_hits_every_candidate_alike():
    from hppctl.runtime.trial import trial_order

    assert [(p, i, c) for p, i, c in trial_order(["A", "B", "C"], 1)] == [(1, 1, "A"), (1, 2, "B"), (1, 3, "C")]
    assert [c for _, _, c in trial_order(["A", "B", "C"], 3)] == list("ABCCBAABC")
    assert [(p, i) for p, i, _ in trial_order(["A", "B"], 2)] == [(1, 1), (1, 2), (2, 2), (2, 1)]
    # a machine slowing by 1 per trial: the two-pass means of equal candidates come out equal
    drift = {c: [] for c in "ABC"}
    for t, (_, _, c) in enumerate(trial_order(["A", "B", "C"], 2)):
        drift[c].append(100.0 - t)
    assert len({sum(v) / 2 for v in drift.values()}) == 1
