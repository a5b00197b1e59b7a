"""Tier 1: TiMePReSt's version difference v, simulated, against the paper's cases and closed form."""

from __future__ import annotations

import pytest

from hppctl.schedule.async_version import (paper_version_difference, recommended_micro_batches,
                                           simulated_version_difference, steady_version_difference)


@pytest.mark.parametrize("W,N,v", [(4, 2, 2), (4, 4, 1), (5, 3, 2), (3, 3, 1)])
def test_paper_worked_cases(W, N, v):
    # Figs. 7(a), 7(b), 9(b)/10, 9(a) of seeds/003.
    result = simulated_version_difference(W, N)
    assert result.simulated == v
    assert result.paper == v


def test_first_mini_batch_ramps_up_from_one():
    assert simulated_version_difference(4, 2).per_mini_batch[:3] == (1, 2, 2)


def test_v_is_one_exactly_when_w_at_most_n_plus_one():
    # eq. 11: W <= N + 1  <=>  v = 1, for all W, N in 2..12 (121 pairs, each side of the line at every
    # N; 2..16 took twice as long and found nothing more). A short window suffices: v > 1 shows from
    # the second mini-batch on (the ramp of test above).
    wrong = [(W, N) for W in range(2, 13) for N in range(2, 13)
             if (simulated_version_difference(W, N, K=4).simulated == 1) != (W <= N + 1)]
    assert wrong == []


@pytest.mark.parametrize("W,N,simulated,paper", [(6, 2, 2, 3), (8, 2, 3, 4), (8, 3, 2, 3), (12, 2, 4, 6)])
def test_paper_formula_overestimates_some_v_above_one(W, N, simulated, paper):
    result = simulated_version_difference(W, N)
    assert (result.simulated, result.paper) == (simulated, paper)


@pytest.mark.parametrize("W,N", [(6, 2), (8, 2), (9, 4), (10, 2), (12, 3), (13, 2)])
def test_uncapped_steady_state_matches_the_notes_formula(W, N):
    assert simulated_version_difference(W, N, in_flight_cap=10**6).simulated == steady_version_difference(W, N)


def test_closed_forms():
    assert [paper_version_difference(W, 2) for W in (2, 3, 4, 5, 6)] == [1, 1, 2, 2, 3]
    assert [steady_version_difference(W, 2) for W in (2, 3, 4, 5, 6)] == [1, 1, 2, 2, 2]
    assert [recommended_micro_batches(W) for W in (2, 3, 4, 8)] == [2, 2, 3, 7]
