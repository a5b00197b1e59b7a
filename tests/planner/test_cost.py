"""Eqs. (3)–(11): closed form vs the literal equations, interpolation, memory, AllReduce."""

import math
import random

import pytest

from hppctl.planner.cost import CostModel, StageChoice, Step, dominant_step, interpolate, round_latency, round_latency_eq456
from tests.conftest import make_profile


def random_steps(rng: random.Random, stages: int) -> list[Step]:
    steps = []
    for s in range(2 * stages - 1):
        f = rng.uniform(0.01, 3.0)
        steps.append(Step(f, f * rng.uniform(1.0, 3.0), rng.uniform(0, 5.0) if s % 2 == 0 and rng.random() < 0.5 else 0.0))
    return steps


def test_notes_worked_example():
    # notes §3.3: E_f = [1, .5, 2, .3, 1], E_b = [2, 1, 4, .6, 2], M = 4 -> dm = 2, head ends at 28.5
    steps = [Step(f, b) for f, b in zip([1, .5, 2, .3, 1], [2, 1, 4, .6, 2])]
    assert dominant_step(steps, 4) == 2
    assert round_latency(steps, 4) == pytest.approx(28.5)


@pytest.mark.parametrize("seed", range(300))
def test_incremental_dominant_step_agrees_with_closed_form(seed):
    rng = random.Random(seed)
    steps = random_steps(rng, rng.randint(1, 8))
    m = rng.randint(1, 64)
    latency, dm = round_latency_eq456(steps, m)
    assert latency == pytest.approx(round_latency(steps, m), rel=1e-12)
    assert dm == dominant_step(steps, m)


def test_single_stage_is_m_times_forward_plus_backward_plus_allreduce():
    assert round_latency([Step(0.5, 1.0, 2.0)], 8) == pytest.approx(8 * 1.5 + 2.0)


def test_interpolation_linear_between_grid_and_proportional_outside():
    grid, values = [2, 8], [1.0, 2.0]
    assert interpolate(grid, values, 2) == 1.0
    assert interpolate(grid, values, 5) == pytest.approx(1.5)
    assert interpolate(grid, values, 1) == pytest.approx(0.5)
    assert interpolate(grid, values, 16) == pytest.approx(4.0)
    assert interpolate(grid, values, 0) == 0.0


def test_memory_is_eq3_with_received_input():
    profile = make_profile(layers=4, speeds=(1.0,))
    cm = CostModel(profile, micro_batch=8, num_micro_batches=4)
    layers = profile.layers
    w = sum(l.param_bytes for l in layers[1:3])
    act = sum(l.activation_bytes_per_sample for l in layers[1:3]) + layers[0].boundary_bytes_per_sample
    # SGD with momentum: params + gradient accumulator + one state tensor = 3 w
    assert cm.memory(1, 3, 8, 5) == int(3 * w + 5 * 8 * act)


def test_allreduce_is_ring_over_slowest_link():
    profile = make_profile(layers=3, speeds=(1, 1, 1), links=[("dev0", "dev2", 1e6)])
    cm = CostModel(profile, micro_batch=8, num_micro_batches=2)
    w = cm.param_bytes(0, 3)
    assert cm.allreduce_time((0, 1, 2), 0, 3) == pytest.approx(2 * 2 * w / (3 * 1e6))
    assert cm.allreduce_time((0,), 0, 3) == 0.0


def test_transfer_uses_boundary_bytes_of_the_cut():
    profile = make_profile(layers=3, speeds=(1, 1))
    cm = CostModel(profile, micro_batch=8, num_micro_batches=2)
    stages = [StageChoice(0, 2, (0,), (8,)), StageChoice(2, 3, (1,), (8,))]
    steps = cm.steps(stages)
    expected = 8 * profile.layers[1].boundary_bytes_per_sample / profile.default_bytes_per_s
    assert steps[1].forward_s == pytest.approx(expected) and steps[1].backward_s == pytest.approx(expected)


def test_time_is_nonlinear_in_batch():
    cm = CostModel(make_profile(layers=2, speeds=(1,)), micro_batch=8, num_micro_batches=1)
    per_sample_1 = cm.forward_time(0, 0, 2, 1)
    per_sample_64 = cm.forward_time(0, 0, 2, 64) / 64
    assert per_sample_1 > 2 * per_sample_64
    assert math.isfinite(per_sample_64)
