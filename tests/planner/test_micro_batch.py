"""`--micro-batch auto` (issue 28 item 2): each strategy's best micro-batch by the planner's own cost model.

The chooser is checked against a brute force written here from the rule (docs/planner.md, "Choosing the
micro-batch"): every divisor of the global batch planned with `make_plan`, the plans that do not fit
memory or leave the profile's measured batch sizes dropped, the best predicted throughput kept; each divisor
planned with no device given more samples than the profile measured it at (`within_profile`).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hppctl.errors import BadInput, Infeasible
from hppctl.models.plan import HppPlan, PlanRequest
from hppctl.planner import make_plan, run_strategy, strategy_names, to_plan
from hppctl.planner.micro_batch import (AUTO_RULE, candidate_micro_batches, compare_auto, divisors,
                                        make_auto_plan)
from hppctl.profiling.synthetic import synthetic_profile
from tests.conftest import make_profile


CEILING_AWARE = {"asteroid", "asteroid-paper", "dp", "pp"}
"""Strategies whose planner splits samples under `CostModel.ceiling` (the others' plans past the profile are
skipped by the rule's outside-the-profile test)."""


def brute_force(profile, global_batch: int, strategy: str) -> tuple[int, HppPlan] | None:
    """The rule, literally: (B, plan) of the best choosable candidate, or None."""
    largest = {d.name: max(d.batch_sizes) for d in profile.devices}
    smallest = {d.name: min(d.batch_sizes) for d in profile.devices}
    best = None
    for b in range(1, global_batch + 1):
        if global_batch % b or global_batch // b > 16384 or b > sum(largest.values()):
            continue
        request = PlanRequest(global_batch=global_batch, micro_batch=b)
        candidate, cm, _ = run_strategy(profile, request, strategy, within_profile=True)
        if candidate is None:
            continue
        plan = to_plan(cm, profile, request, strategy, candidate, 0.0)
        assert all(y <= largest[d] for s in plan.stages for d, y in zip(s.devices, s.samples)
                   ) or strategy not in CEILING_AWARE, strategy
        if plan.memory_violations:
            continue
        if any(y > largest[d] or 0 < y < smallest[d] for s in plan.stages for d, y in zip(s.devices, s.samples)):
            continue
        score = (plan.prediction.throughput_samples_per_s, -b)
        if best is None or score > best[0]:
            best = (score, b, plan)
    return None if best is None else (best[1], best[2])


def decisions(plan: HppPlan) -> dict:
    """What a plan decides and predicts (not how long planning took, nor the choice record)."""
    return plan.model_dump(mode="json", exclude={"planning_time_s", "micro_batch_choice"})


def random_profile(seed: int):
    rng = random.Random(seed)
    n = rng.randint(2, 4)
    grid = rng.choice([[1, 2, 4, 8], [1, 4, 16, 32], [2, 8, 64], None])
    return synthetic_profile(rng.randint(4, 8), [rng.choice([1.0, 1.5, 2.0, 3.0]) for _ in range(n)],
                             memory_bytes=[rng.choice([3, 20, 400]) * 10**6 for _ in range(n)], seed=seed,
                             grid=grid, activation_scale=rng.choice([1.0, 8.0]),
                             bandwidth_bytes_per_s=rng.choice([2e6, 12.5e6, 125e6]))


@pytest.mark.parametrize("seed", range(8))
def test_auto_picks_what_brute_force_over_the_candidates_picks(seed):
    profile = random_profile(seed)
    global_batch = random.Random(seed).choice([24, 32, 48, 64])
    for strategy in strategy_names():
        expected = brute_force(profile, global_batch, strategy)
        if expected is None:
            with pytest.raises(Infeasible):
                make_auto_plan(profile, global_batch, strategy)
            continue
        plan = make_auto_plan(profile, global_batch, strategy)
        assert plan.micro_batch == expected[0], strategy
        assert decisions(plan) == decisions(expected[1]), strategy
        choice = plan.micro_batch_choice
        assert choice.chosen == plan.micro_batch and choice.rule == AUTO_RULE
        assert [c.micro_batch for c in choice.candidates] == candidate_micro_batches(profile, global_batch)


def test_candidates_are_the_divisors_the_profile_covers():
    # two devices measured up to 8 samples: no plan of more than 16 samples per micro-batch stays within them
    profile = make_profile(layers=6, speeds=(1, 2), grid=[1, 2, 4, 8])
    assert divisors(64) == [1, 2, 4, 8, 16, 32, 64]
    assert candidate_micro_batches(profile, 64) == [1, 2, 4, 8, 16]
    assert candidate_micro_batches(profile, 48) == [1, 2, 3, 4, 6, 8, 12, 16]
    # at most 16384 micro-batches per round: B = 1 and 2 would be 40000 and 20000
    assert candidate_micro_batches(profile, 40000)[:2] == [4, 5]


def test_a_plan_beyond_the_profiled_batch_sizes_is_skipped():
    # pp puts the whole micro-batch on one device per stage: at 16 samples a device profiled up to 8 would
    # run twice what was measured (the cost model could only scale its times proportionally)
    profile = make_profile(layers=6, speeds=(1, 2), grid=[1, 2, 4, 8])
    plan = make_auto_plan(profile, 64, "pp")
    skipped = {c.micro_batch: c.skipped for c in plan.micro_batch_choice.candidates if c.skipped}
    assert 16 in skipped and "beyond the profile" in skipped[16] and "profiled up to 8" in skipped[16]
    assert plan.micro_batch <= 8


def test_a_plan_below_the_profiled_batch_sizes_is_skipped():
    # measured from 4 samples up: one sample on a device would be scaled down proportionally from 4,
    # which flatters small micro-batches (per-sample time grows as the batch shrinks)
    profile = make_profile(layers=6, speeds=(1, 2), grid=[4, 8, 16])
    plan = make_auto_plan(profile, 64, "pp")
    skipped = {c.micro_batch: c.skipped for c in plan.micro_batch_choice.candidates if c.skipped}
    assert skipped[1].startswith("below the profile: dev") and skipped[1].endswith("would run 1 samples per micro-batch (stage 0), it was profiled from 4")
    assert {1, 2} <= set(skipped) and plan.micro_batch >= 4


def test_micro_batches_that_do_not_fit_memory_are_skipped_and_none_fitting_is_infeasible():
    # activations of 64x the usual size: large micro-batches do not fit a 60 MB device
    profile = make_profile(layers=6, speeds=(1, 2), memory_gb=(0.06, 0.06), activation_scale=64.0)
    plan = make_auto_plan(profile, 64, "asteroid")
    candidates = {c.micro_batch: c for c in plan.micro_batch_choice.candidates}
    assert candidates[64].skipped == "no plan fits the memory budgets"
    assert candidates[plan.micro_batch].throughput_samples_per_s == plan.prediction.throughput_samples_per_s
    assert not plan.memory_violations
    # a memory-blind baseline's plans over budget are not chosen either
    dapple = make_auto_plan(profile, 64, "dapple")
    assert not dapple.memory_violations
    assert any((c.skipped or "").startswith("does not fit") for c in dapple.micro_batch_choice.candidates)
    tiny = make_profile(layers=6, speeds=(1, 2), memory_gb=(0.0005, 0.0005), activation_scale=64.0)
    with pytest.raises(Infeasible, match=r"micro-batch 1\):.*--micro-batch auto tried 1/2/4/8/16/32/64"):
        make_auto_plan(tiny, 64, "asteroid")


def linear_profile(grid: list[int]):
    """One device whose times are exactly proportional to the batch size on a power-of-two grid."""
    profile = make_profile(layers=4, speeds=(1,), grid=grid)
    device = profile.devices[0]
    rows = [[2.0**-(10 + layer) * b for b in grid] for layer in range(len(profile.layers))]
    return profile.model_copy(update={"devices": [device.model_copy(update={
        "forward_s": rows, "backward_s": [[2 * t for t in row] for row in rows]})]})


def test_ties_go_to_the_smaller_micro_batch():
    # times proportional to the batch size, and powers of two scale without rounding: every micro-batch's
    # round is exactly G x the time per sample, so all candidates tie
    plan = make_auto_plan(linear_profile([1, 2, 4]), 16, "dp")
    throughputs = {c.throughput_samples_per_s for c in plan.micro_batch_choice.candidates}
    assert [c.micro_batch for c in plan.micro_batch_choice.candidates] == [1, 2, 4]
    assert len(throughputs) == 1 and plan.micro_batch == 1


def test_every_candidate_outside_the_profile_is_infeasible_saying_so():
    # measured at 4 samples only; the divisors of 6 up to 4 are 1, 2 and 3: every plan runs fewer
    profile = make_profile(layers=4, speeds=(1,), grid=[4])
    with pytest.raises(Infeasible, match=r"^--micro-batch auto tried 1/2/3: no plan stays within the profile's batch "
                                         r"sizes \(below the profile: dev0 would run 1 samples"):
        make_auto_plan(profile, 6, "dp")


def test_no_candidate_at_all_is_bad_input():
    profile = make_profile(layers=4, speeds=(1,), grid=[1, 2])
    with pytest.raises(BadInput, match="no divisor of --global-batch 65536"):
        make_auto_plan(profile, 65536, "dp")  # B <= 2 means at least 32768 micro-batches


def test_dp_with_one_micro_batch_per_round_is_chosen_when_it_is_fastest():
    # issue 28: dp at B = 32 ran 8 small forwards per device; with per-sample time falling with the batch
    # size and one AllReduce per round either way, one micro-batch per round is dp's best plan
    profile = make_profile(layers=6, speeds=(1, 1, 2))
    plan = make_auto_plan(profile, 256, "dp")
    assert plan.num_micro_batches == 1 and plan.micro_batch == 256
    at_32 = make_plan(profile, PlanRequest(global_batch=256, micro_batch=32), "dp")
    assert plan.prediction.throughput_samples_per_s > at_32.prediction.throughput_samples_per_s


def test_compare_auto_gives_every_strategy_its_own_best():
    profile = random_profile(3)
    rows = compare_auto(profile, 32)
    assert {r.strategy for r in rows} == set(strategy_names())
    for row in rows:
        expected = brute_force(profile, 32, row.strategy)
        if expected is not None:
            assert row.plan.micro_batch == expected[0] and row.plan.micro_batch_choice is not None
            assert row.as_json()["micro_batch"] == expected[0]


def test_the_chooser_imports_neither_torch_nor_fabric():
    import subprocess
    import sys

    code = ("import hppctl.planner.micro_batch, sys; "
            "assert 'torch' not in sys.modules and 'fabric' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def brute_force_simulated(profile, global_batch: int, strategy: str) -> int | None:
    """The rule ranked by the simulator: B of the choosable candidate whose replayed plan is fastest."""
    from hppctl.schedule import simulated_round_latency
    simulate = simulated_round_latency(profile)
    largest = {d.name: max(d.batch_sizes) for d in profile.devices}
    smallest = {d.name: min(d.batch_sizes) for d in profile.devices}
    best = None
    for b in range(1, global_batch + 1):
        if global_batch % b or b > sum(largest.values()):
            continue
        request = PlanRequest(global_batch=global_batch, micro_batch=b)
        candidate, cm, _ = run_strategy(profile, request, strategy, within_profile=True)
        if candidate is None:
            continue
        plan = to_plan(cm, profile, request, strategy, candidate, 0.0)
        assert all(y <= largest[d] for s in plan.stages for d, y in zip(s.devices, s.samples)
                   ) or strategy not in CEILING_AWARE, strategy
        if plan.memory_violations or any(y > largest[d] or 0 < y < smallest[d]
                                         for s in plan.stages for d, y in zip(s.devices, s.samples)):
            continue
        score = (global_batch / simulate(plan), -b)
        if best is None or score > best[0]:
            best = (score, b)
    return None if best is None else best[1]


@pytest.mark.parametrize("seed", range(4))
def test_with_the_simulator_auto_picks_the_fastest_replayed_plan(seed):
    from hppctl.schedule import simulated_round_latency
    profile = random_profile(seed)
    global_batch = random.Random(seed).choice([24, 32, 48, 64])
    for strategy in ("asteroid", "dp", "dapple", "pp"):
        expected = brute_force_simulated(profile, global_batch, strategy)
        if expected is None:
            continue
        plan = make_auto_plan(profile, global_batch, strategy, simulated_round_latency(profile))
        choice = plan.micro_batch_choice
        assert plan.micro_batch == expected and choice.ranked_by == "simulated", strategy
        assert all((c.skipped is None) == (c.simulated_samples_per_s is not None) for c in choice.candidates)


def test_the_simulator_overrules_the_estimate_where_they_disagree():
    """Env B presets, mobilenetv2, global batch 256: asteroid's estimate prefers a deep pipeline at B = 64
    that the simulator replays slower than a plan at another B; with the simulator auto takes the latter."""
    from hppctl.models.cluster import ClusterSpec
    from hppctl.profiling.from_presets import build_preset_profile
    from hppctl.schedule import simulated_round_latency
    from hppctl.store import load
    from hppctl.zoo import layer_costs
    profile = build_preset_profile(load(Path(__file__).resolve().parents[2] / "profiles/env-b.yaml", ClusterSpec), layer_costs("mobilenetv2", "fine"),
                                   model="mobilenetv2", granularity="fine")
    simulate = simulated_round_latency(profile)
    by_estimate = make_auto_plan(profile, 256, "asteroid")
    by_simulation = make_auto_plan(profile, 256, "asteroid", simulate)
    assert by_estimate.micro_batch != by_simulation.micro_batch
    assert 256 / simulate(by_simulation) > 256 / simulate(by_estimate)
    assert by_estimate.micro_batch_choice.ranked_by == "estimate"
