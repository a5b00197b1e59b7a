"""Tier 1: Galaxy's planner (Algorithm 1) and the baselines' layouts on small readable profiles."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hppctl.errors import BadInput, Infeasible
from hppctl.planner.galaxy import (InferenceCosts, largest_remainder, make_inference_plan, split_rows)
from tests.galaxy.factories import make_inference_profile

# Layer weights of the default profile: M_att = 4*48*48 + 4*48 = 9408 params, M_mlp = 2*48*192 + 240 = 18672,
# x 4 bytes x 4 layers = 449,280 bytes for the whole model.
WHOLE = 4 * 4 * (9408 + 18672)


def shares(plan):
    return [(s.heads, s.columns, s.rows) for s in plan.shares]


@pytest.mark.parametrize("total, weights, expected", [
    (12, [3, 2, 1], [6, 4, 2]),
    (20, [1.47, 0.825, 0.403], [11, 6, 3]),
    (7, [1, 1, 1], [3, 2, 2]),
    (5, [1, 0], [5, 0]),
])
def test_largest_remainder_keeps_the_total(total, weights, expected):
    assert largest_remainder(total, weights) == expected


@pytest.mark.parametrize("seq_len, parts, expected", [(284, 3, [95, 95, 94]), (10, 4, [3, 3, 2, 2]), (5, 1, [5])])
def test_sequence_rows_are_split_equally(seq_len, parts, expected):
    assert split_rows(seq_len, parts) == expected


def test_galaxy_splits_heads_and_columns_by_capacity_when_memory_is_ample():
    plan = make_inference_plan(make_inference_profile(speeds=(3, 2, 1)), "galaxy")
    assert shares(plan) == [(6, 96, 22), (4, 64, 21), (2, 32, 21)]
    assert not plan.memory_violations


def test_memory_aware_balancing_moves_mlp_columns_first():
    # arrange: the fast device can hold a third of the model, not its capacity share (half)
    budgets = (WHOLE / 3 / 1e6, 1, 1)
    profile = make_inference_profile(speeds=(3, 2, 1), budgets_mb=budgets)
    # act
    plan = make_inference_plan(profile, "galaxy")
    # assert: heads keep their capacity split; d0 sheds columns to d1 and d2 by their capacity (2:1)
    (a0, b0, _), (a1, b1, _), (a2, b2, _) = shares(plan)
    assert (a0, a1, a2) == (6, 4, 2)
    assert b0 < 96 and b1 > 64 and b2 > 32 and b0 + b1 + b2 == 192
    assert (b1 - 64) == pytest.approx(2 * (b2 - 32), abs=1)
    assert plan.shares[0].memory_bytes < plan.shares[0].memory_budget_bytes


def test_heads_move_when_columns_are_not_enough():
    # d0 can hold less than its heads alone: all of its columns and some heads must go
    budgets = (WHOLE * 0.1 / 1e6, 1, 1)
    plan = make_inference_plan(make_inference_profile(speeds=(3, 2, 1), budgets_mb=budgets), "galaxy")
    (a0, b0, _), *_ = shares(plan)
    assert b0 == 0 and a0 < 6
    assert sum(s.heads for s in plan.shares) == 12
    assert all(s.memory_bytes < s.memory_budget_bytes for s in plan.shares)


def test_galaxy_fails_when_the_devices_cannot_hold_the_model_together():
    budgets = tuple(WHOLE * 0.3 / 1e6 for _ in range(3))
    with pytest.raises(Infeasible, match="no inference plan fits"):
        make_inference_plan(make_inference_profile(budgets_mb=budgets), "galaxy")


def test_megatron_is_equal_and_reports_oom_instead_of_avoiding_it():
    budgets = (1, 1, WHOLE * 0.3 / 1e6)  # a third of the model does not fit in 30%
    plan = make_inference_plan(make_inference_profile(speeds=(3, 2, 1), budgets_mb=budgets), "megatron")
    assert shares(plan) == [(4, 64, 64)] * 3
    assert [v.device for v in plan.memory_violations] == ["d2"]


def test_sp_holds_the_whole_model_on_every_device():
    budgets = (WHOLE * 2 / 1e6, WHOLE * 0.5 / 1e6, WHOLE * 2 / 1e6)
    plan = make_inference_plan(make_inference_profile(budgets_mb=budgets), "sp")
    assert shares(plan) == [(12, 192, 22), (12, 192, 21), (12, 192, 21)]
    assert [v.device for v in plan.memory_violations] == ["d1"]


def test_local_picks_the_fastest_device_that_fits():
    budgets = (WHOLE * 0.5 / 1e6, WHOLE * 2 / 1e6, WHOLE * 2 / 1e6)
    plan = make_inference_plan(make_inference_profile(speeds=(3, 2, 1), budgets_mb=budgets), "local")
    assert [s.device for s in plan.shares] == ["d1"] and not plan.memory_violations


def test_galaxy_beats_the_baselines_on_a_heterogeneous_profile_and_overlap_hides_communication():
    profile = make_inference_profile(speeds=(1.47, 0.825, 0.403), layers=4)
    plans = {s: make_inference_plan(profile, s) for s in ("galaxy", "megatron", "sp", "local")}
    galaxy = plans["galaxy"].prediction
    assert galaxy.latency_s < min(plans[s].prediction.latency_s for s in ("megatron", "sp", "local"))
    assert galaxy.exposed_communication_s < galaxy.communication_s


def test_capacity_is_the_inverse_of_whole_blocks():
    costs = InferenceCosts(make_inference_profile(speeds=(2, 1, 1)), 64)
    # whole attention 12 ms, whole MLP 12 ms at speed 1
    assert costs.capacity(1) == pytest.approx(1 / 0.024)
    assert costs.capacity(0) == pytest.approx(2 / 0.024)


def test_sequence_length_is_interpolated_between_profiled_lengths_and_refused_outside():
    profile = make_inference_profile(seq_lens=(64, 128))
    mid = InferenceCosts(profile, 96)
    assert mid.attention(0, 12) == pytest.approx((12e-3 / 3 + 24e-3 / 3) / 2)
    with pytest.raises(BadInput, match="--seq-len: 256 is outside"):
        make_inference_plan(profile, "galaxy", 256)


def test_planner_imports_no_torch():
    code = ("import sys, hppctl.planner.galaxy as g; g._load_strategies(); "
            "assert 'torch' not in sys.modules and 'fabric' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
