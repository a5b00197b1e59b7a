"""Algorithm 2 and the strategies: DP vs exhaustive search, memory, sample coverage, baselines."""

import random
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from hppctl.models.plan import PlanRequest
from hppctl.planner import compare, cost_model, make_plan
from hppctl.planner.asteroid import AsteroidDP, memory_order
from hppctl.planner.exhaustive import best_plan
from tests.conftest import make_profile

GAPS: list[float] = []
IMPROVED_GAPS: list[float] = []


def small_instance(seed: int):
    rng = random.Random(seed)
    n = rng.randint(1, 3 if seed % 4 else 4)
    layers = rng.randint(1, 5 if n == 4 else 6)
    profile = make_profile(layers=layers, speeds=[rng.uniform(0.3, 3) for _ in range(n)],
                           memory_gb=[rng.choice([0.05, 0.2, 1.0]) for _ in range(n)], seed=seed,
                           activation_scale=rng.choice([1, 20, 100]), param_scale=rng.choice([1, 50]))
    return profile, PlanRequest(global_batch=6 * rng.choice([1, 2, 4]), micro_batch=6)


@pytest.mark.parametrize("seed", range(24))
def test_dp_against_exhaustive_search(seed):
    profile, request = small_instance(seed)
    cm = cost_model(profile, request)
    optimum, _ = best_plan(cm)
    dp = AsteroidDP(cm, memory_order(cm)).best(devices=len(cm.names))
    if dp is None:
        return  # the paper's DP uses every device; it may find nothing where a subset would fit
    evaluation = cm.evaluate(dp.stages)
    assert evaluation.feasible, "the DP must never exceed a memory budget"
    assert evaluation.round_latency_s == pytest.approx(dp.latency, rel=1e-9)
    assert evaluation.round_latency_s >= optimum * (1 - 1e-9)  # exhaustive is a true lower bound
    improved = make_plan(profile, request, "asteroid")
    assert improved.prediction.round_latency_s <= evaluation.round_latency_s * (1 + 1e-9)
    GAPS.append(evaluation.round_latency_s / optimum - 1)
    IMPROVED_GAPS.append(improved.prediction.round_latency_s / optimum - 1)


def test_report_largest_gap():
    # Runs after the parametrised cases (file order); the figure is recorded in docs/planner.md.
    if GAPS:
        print(f"\nvs exhaustive search over {len(GAPS)} instances: largest gap asteroid-paper {max(GAPS):.1%}, "
              f"asteroid {max(IMPROVED_GAPS):.1%}; instances where asteroid-paper is optimal: "
              f"{sum(g < 1e-9 for g in GAPS)}, asteroid: {sum(g < 1e-9 for g in IMPROVED_GAPS)}")


@pytest.mark.parametrize("seed", range(12))
def test_every_plan_covers_every_sample_once_and_fits(seed):
    rng = random.Random(100 + seed)
    profile = make_profile(layers=rng.randint(4, 20), speeds=[rng.uniform(0.5, 3) for _ in range(rng.randint(2, 6))],
                           seed=seed, activation_scale=rng.choice([1, 30]))
    request = PlanRequest(global_batch=256, micro_batch=rng.choice([16, 32, 64]))
    for row in compare(profile, request):
        if row.plan is None:
            continue
        plan = row.plan
        assert plan.stages[0].start == 0 and plan.stages[-1].end == len(profile.layers)
        for a, b in zip(plan.stages, plan.stages[1:]):
            assert a.end == b.start
        for stage in plan.stages:
            assert sum(stage.samples) == request.micro_batch
        devices = plan.devices()
        assert len(devices) == len(set(devices))
        if row.strategy in ("asteroid", "asteroid-paper", "dp", "pp"):
            assert not plan.memory_violations


def test_asteroid_beats_or_matches_every_feasible_baseline():
    profile = make_profile(layers=40, speeds=(1, 1, 1, 2, 2, 3), memory_gb=(4, 4, 4, 8, 8, 8), activation_scale=5)
    rows = {r.strategy: r for r in compare(profile, PlanRequest(global_batch=2048, micro_batch=64))}
    for name, row in rows.items():
        if row.feasible:
            assert rows["asteroid"].throughput >= row.throughput * (1 - 1e-9), name


def test_memory_blind_baselines_report_violations():
    profile = make_profile(layers=12, speeds=(1, 1, 1, 1), memory_gb=(4, 0.02, 0.02, 0.02), activation_scale=40)
    rows = {r.strategy: r for r in compare(profile, PlanRequest(global_batch=512, micro_batch=64))}
    assert rows["pipedream"].plan.memory_violations or rows["dapple"].plan.memory_violations
    assert not rows["asteroid"].plan.memory_violations


def test_planner_does_not_import_torch_or_fabric():
    code = "import hppctl.planner, hppctl.planner.explain, sys; " \
           "assert 'torch' not in sys.modules and 'fabric' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("seed", range(10))
def test_pruned_dp_gives_the_same_answer_as_the_full_dp(seed):
    from tests.planner.wobbly import assert_the_pruned_dp_gives_the_full_dps_answer

    rng = random.Random(500 + seed)
    n = rng.randint(2, 6)
    profile = make_profile(layers=rng.randint(5, 40), speeds=[rng.uniform(0.3, 3) for _ in range(n)],
                           memory_gb=[rng.choice([0.1, 0.5, 4]) for _ in range(n)], seed=seed,
                           activation_scale=rng.choice([1, 30]), param_scale=rng.choice([1, 30]))
    assert_the_pruned_dp_gives_the_full_dps_answer(cost_model(profile, PlanRequest(global_batch=512,
                                                                         micro_batch=rng.choice([16, 64]))))


def test_asteroid_plans_have_no_idle_devices():
    # regression: a device with 0 samples stayed in its group and only slowed the AllReduce
    from pathlib import Path

    from hppctl.models.profile import Profile
    from hppctl.store import load

    profile = load(Path(__file__).resolve().parents[2] / "profiles/example-tiny.json", Profile)
    plan = make_plan(profile, PlanRequest(global_batch=64, micro_batch=16), "asteroid")
    assert all(y > 0 for stage in plan.stages for y in stage.samples)


@settings(max_examples=300, deadline=None)
@given(total=st.floats(0, 100), buckets=st.integers(1, 64), forward=st.floats(0, 50), backward=st.floats(0, 50),
       shortfall=st.floats(0, 1), m=st.integers(1, 64))
def test_the_heads_allreduce_floor_never_exceeds_what_the_head_adds(total, buckets, forward, backward, shortfall, m):
    """AsteroidDP prunes a head by M h + X(h) and h + X(h), h a lower bound of its E_f + E_b and X the
    exposed AllReduce: valid although X falls as the backward grows (it falls slower than M h rises)."""
    from hppctl.planner.cost import exposed_allreduce

    step = forward + backward
    h = step * shortfall  # any lower bound of E_f + E_b
    exposed = exposed_allreduce(total, backward, buckets)
    at_h = exposed_allreduce(total, h, buckets)
    assert m * h + at_h <= (m * step + exposed) * (1 + 1e-12) + 1e-12
    assert h + at_h <= (step + exposed) * (1 + 1e-12) + 1e-12


def test_the_allreduce_floor_prunes_heads_before_algorithm_1(monkeypatch):
    """A deterministic count of head columns Algorithm 1 evaluates on a synthetic 200 x 12 profile
    with replicated stages. With X >= T_a / n as the floor (before) it ran 505842 of them; the floor
    M h + X(h) leaves 462605 (and 10.0 M instead of 13.3 M on the 1000 x 16 of bench/planner_scale.py,
    8.2 against 10.6 s of CPU: the 10 s target of issue 28 had slipped to 12 s). Each head's own floor
    (`GroupAllocator.time_floor`: a fixed cost per micro-batch counted) then leaves 248973. The plans are
    the same (test_plans_unchanged.py)."""
    from hppctl.planner.strategies.asteroid import plan_asteroid
    from hppctl.planner.vector_alloc import GroupAllocator
    from hppctl.profiling.synthetic import synthetic_profile

    profile = synthetic_profile(200, [1 + (i % 4) for i in range(12)],
                                memory_bytes=[(4 + 4 * (i % 2)) * 10**9 for i in range(12)], grid=[1, 2, 4, 8, 16, 32, 64])
    cm = cost_model(profile, PlanRequest(global_batch=1024, micro_batch=64))
    evaluated = []
    original = GroupAllocator.for_warmup

    def counting(self, warmup, cols=None, **kwargs):
        evaluated.append(len(self.start) if cols is None else len(cols))
        return original(self, warmup, cols, **kwargs)

    monkeypatch.setattr(GroupAllocator, "for_warmup", counting)
    plan_asteroid(cm)
    assert sum(evaluated) <= 248973


def dp_tables(dp: AsteroidDP) -> dict:
    return {key: [getattr(table, f).tolist() for f in ("latency", "a", "z", "head_size", "next_layer", "next_devices")]
            for key, table in dp.q.items()}


@pytest.mark.parametrize("seed", range(8))
def test_the_dp_split_with_a_forked_child_fills_the_one_process_tables_bit_for_bit(seed):
    """`AsteroidDP(parallel=True)` (on by itself past PARALLEL_MIN_HEAD_PAIRS head pairs, e.g. the
    1000 x 16 plan) gives half the head groups to a forked child, which tries heads against its own
    rows' bests: every table equal to the one-process DP's, with and without the pruning bound."""
    from hppctl.planner.strategies.asteroid import in_space_bound

    rng = random.Random(500 + seed)
    n = rng.randint(3, 7)
    profile = make_profile(layers=rng.randint(12, 40), speeds=[rng.uniform(0.3, 3) for _ in range(n)],
                           memory_gb=[rng.choice([0.05, 0.2, 1.0, 4.0]) for _ in range(n)], seed=seed,
                           activation_scale=rng.choice([1, 20, 100]), param_scale=rng.choice([1, 50]))
    cm = cost_model(profile, PlanRequest(global_batch=64, micro_batch=rng.choice([4, 8, 16])))
    order = memory_order(cm)
    for bound in (float("inf"), in_space_bound(cm, order)):
        one, two = AsteroidDP(cm, order, bound, parallel=False), AsteroidDP(cm, order, bound, parallel=True)
        assert dp_tables(two) == dp_tables(one)
        assert two.best() == one.best()


def test_a_child_that_sends_nothing_leaves_its_groups_to_the_parent(monkeypatch):
    """A child that dies before sending (here: its pickling fails) is not waited on forever, and its
    head groups are planned in the parent: the same tables."""
    import hppctl.planner.forked as forked

    profile = make_profile(layers=16, speeds=[1.0, 2.0, 1.5, 0.7, 3.0], seed=3)
    cm = cost_model(profile, PlanRequest(global_batch=64, micro_batch=8))
    one = AsteroidDP(cm, memory_order(cm), parallel=False)

    def fail(*args, **kwargs):
        raise RuntimeError("the child cannot send")

    monkeypatch.setattr(forked.pickle, "dump", fail)  # only the child pickles
    assert dp_tables(AsteroidDP(cm, memory_order(cm), parallel=True)) == dp_tables(one)
