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


@pytest.mark.parametrize("seed", range(20))
def test_exposed_allreduce_is_the_end_of_a_bucket_chain_fed_by_the_last_backward(seed):
    """n buckets ready at k/n of the last backward, summed one after another on the link: the last
    ends max(T_a/n, T_a - E_b (1 - 1/n)) after the backward; the vectorised twin agrees bit for bit."""
    import numpy as np

    from hppctl.planner.cost import exposed_allreduce
    from hppctl.planner.vector_alloc import exposed_allreduce_many

    rng = random.Random(seed)
    total, backward, n = rng.uniform(0, 5), rng.uniform(0, 5), rng.randint(1, 40)
    end = -math.inf
    for k in range(1, n + 1):
        end = max(end, backward * k / n) + total / n
    assert exposed_allreduce(total, backward, n) == pytest.approx(end - backward, rel=1e-12, abs=1e-12)
    assert exposed_allreduce(total, backward, 1) == total
    many = exposed_allreduce_many(np.array([total]), np.array([backward]), np.array([float(n)]))
    assert many[0] == exposed_allreduce(total, backward, n)


def test_replicated_stage_step_counts_buckets_and_the_latency_only_the_exposed_part():
    profile = make_profile(layers=6, speeds=(1.0, 1.0), param_scale=20)
    cm = CostModel(profile, micro_batch=16, num_micro_batches=4)
    step = cm.stage_step(StageChoice(0, 6, (0, 1), (8, 8)))
    assert step.buckets == math.ceil(cm.param_bytes(0, 6) / 2**22) > 1
    assert 0 < step.exposed_allreduce_s < step.allreduce_s
    assert round_latency([step], 4) == 4 * (step.forward_s + step.backward_s) + step.exposed_allreduce_s
    assert cm.stage_step(StageChoice(0, 6, (0,), (16,))).buckets == 1  # one device: nothing to sum
