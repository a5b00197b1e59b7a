"""The simulator against closed forms: one stage, a data-parallel stage, two-stage pipelines, memory, links."""

import pytest

from hppctl.models.plan import PlanRequest
from hppctl.planner import make_plan
from hppctl.planner.cost import Step, round_latency
from hppctl.schedule import ProfileTimings, check_schedule, simulate, simulate_plan
from tests.conftest import make_profile
from tests.schedule.factories import FixedTimings, make_schedule


def run(groups, M, timings, policy="1f1b-asteroid", mode="async", trace=False):
    schedule = make_schedule(groups, M, policy)
    check_schedule(schedule)
    return simulate(schedule, timings, mode=mode, trace=trace)


@pytest.mark.parametrize("policy", ["1f1b-asteroid", "1f1b", "gpipe"])
@pytest.mark.parametrize("f, b, M, step", [(1.0, 2.0, 1, 0.0), (0.25, 0.5, 8, 0.125), (3.0, 1.0, 64, 2.0)])
def test_one_stage_on_one_device_is_m_times_forward_plus_backward_plus_step(f, b, M, step, policy):
    r = run([[8]], M, FixedTimings([f], [b], step_s=step), policy)
    assert r.round_latency_s == M * (f + b) + step
    assert r.devices[0].compute_s == pytest.approx(M * (f + b) + step)


@pytest.mark.parametrize("devices, M, ar", [(2, 4, 0.5), (4, 16, 1.25)])
def test_data_parallel_stage_adds_one_allreduce(devices, M, ar):
    samples = [8 // devices] * devices
    r = run([samples], M, FixedTimings([1.0], [2.0], allreduce=[ar], step_s=0.5))
    assert r.round_latency_s == M * 3.0 + ar + 0.5
    assert all(d.allreduce_s == ar for d in r.devices)


@pytest.mark.parametrize("buckets, exposed", [(1, 3.0), (2, 2.0), (4, 1.5), (16, 1.125)])
def test_replicated_stage_hides_its_allreduce_behind_the_last_backward_as_the_estimate_does(buckets, exposed):
    # T_a = 3 in n buckets, last backward 2 s: max(T_a / n, T_a - E_b (1 - 1/n)) is left after it
    r = run([[4, 4]], 4, FixedTimings([1.0], [2.0], allreduce=[3.0], buckets=[buckets]), trace=True)
    assert r.round_latency_s == pytest.approx(4 * 3.0 + exposed, rel=1e-12)
    assert round_latency([Step(1.0, 2.0, 3.0, buckets)], 4) == pytest.approx(r.round_latency_s, rel=1e-12)
    assert all(d.allreduce_s == pytest.approx(exposed, rel=1e-12) for d in r.devices)
    lanes = [s for s in r.spans if s.track.endswith(" allreduce")]
    assert len(lanes) == (2 * buckets if buckets > 1 else 0)
    if buckets > 1:  # the first bucket is summed while the last backward runs
        last_backward_end = max(s.start_s + s.duration_s for s in r.spans if s.category == "backward")
        assert min(s.start_s for s in lanes) < last_backward_end


def test_profile_timings_replicated_stage_reproduce_the_plans_estimate_with_overlap():
    # two equal devices sharing one stage whose gradients make 4 buckets: the plan counts them, the replay too
    profile = make_profile(layers=6, speeds=(1.0, 1.0), memory_gb=(8, 8), param_scale=20)
    plan = make_plan(profile, PlanRequest(global_batch=256, micro_batch=16), "dp")
    stage = plan.stages[0]
    assert len(stage.devices) == 2 and stage.allreduce_buckets > 1
    assert stage.allreduce_exposed_s < stage.allreduce_s
    _, r = simulate_plan(plan, profile)
    assert r.round_latency_s == pytest.approx(plan.prediction.round_latency_s, rel=1e-12)


# Two single-device stages, Asteroid K = (3, 1). c is the cut's one-way time per micro-batch.
TWO_STAGE = [
    # stage 1 dominant: f0 + c + M (f1 + b1) + c + b0
    (dict(f0=1, b0=2, f1=2, b1=4, c=0.5, M=8), lambda f0, b0, f1, b1, c, M: f0 + c + M * (f1 + b1) + c + b0),
    (dict(f0=0.5, b0=1, f1=1, b1=1.5, c=0.25, M=16), lambda f0, b0, f1, b1, c, M: f0 + c + M * (f1 + b1) + c + b0),
    # stage 0 dominant and K_0 = 3 hides the round trip: M (f0 + b0)
    (dict(f0=2, b0=4, f1=1, b1=2, c=0.5, M=8), lambda f0, b0, f1, b1, c, M: M * (f0 + b0)),
    (dict(f0=3, b0=3, f1=1, b1=1, c=0.2, M=5), lambda f0, b0, f1, b1, c, M: M * (f0 + b0)),
    # no transfer time, equal stages: (M + P - 1)(f + b)
    (dict(f0=1, b0=2, f1=1, b1=2, c=0, M=8), lambda f0, b0, f1, b1, c, M: (M + 1) * (f0 + b0)),
]


@pytest.mark.parametrize("case, formula", TWO_STAGE)
def test_two_stage_pipeline_matches_the_closed_form(case, formula):
    timings = FixedTimings([case["f0"], case["f1"]], [case["b0"], case["b1"]], [case["c"]])
    r = run([[8], [8]], case["M"], timings)
    assert r.round_latency_s == pytest.approx(formula(**case), rel=1e-12)
    # ... which is also what the planner's Eqs. 4-6 give in these cases.
    steps = [Step(case["f0"], case["b0"]), Step(case["c"], case["c"]), Step(case["f1"], case["b1"])]
    assert round_latency(steps, case["M"]) == pytest.approx(r.round_latency_s, rel=1e-12)


@pytest.mark.parametrize("policy", ["1f1b", "gpipe"])
def test_equal_stages_without_transfers_take_m_plus_p_minus_1_slots(policy):
    r = run([[8], [8], [8]], 6, FixedTimings([1, 1, 1], [2, 2, 2], [0, 0]), policy)
    assert r.round_latency_s == (6 + 3 - 1) * 3


def test_full_duplex_links_beat_the_closed_form_when_transfers_dominate():
    # The estimate serialises E_f + E_b of a cut; a full-duplex link carries both directions at once.
    timings = FixedTimings([1, 1], [2, 2], [3])
    r = run([[8], [8]], 8, timings, trace=True)
    steps = [Step(1, 2), Step(3, 3), Step(1, 2)]
    assert r.round_latency_s < round_latency(steps, 8)
    forward = [s for s in r.spans if s.track == "d0->d1"]
    backward = [s for s in r.spans if s.track == "d1->d0"]
    assert any(a.start_s < g.start_s + g.duration_s and g.start_s < a.start_s + a.duration_s
               for a in forward for g in backward), "activations and gradients never overlapped"


def test_a_devices_sends_share_its_uplink_one_after_another():
    # d0 sends every micro-batch to d1 (samples 0:2) and d2 (2:8): 2/8 and 6/8 of 4 s.
    r = run([[8], [2, 6]], 3, FixedTimings([0.5, 0.5], [0.5, 0.5], [4.0]), trace=True)
    sends = sorted((s for s in r.spans if s.track.startswith("d0->")), key=lambda s: s.start_s)
    assert [s.duration_s for s in sends[:2]] == [1.0, 3.0]
    for a, b in zip(sends, sends[1:]):
        assert b.start_s >= a.start_s + a.duration_s - 1e-12
    assert sum(s.duration_s for s in sends) == 3 * 4.0


@pytest.mark.parametrize("policy, expected", [("1f1b-asteroid", [5, 3, 1]), ("1f1b", [3, 2, 1]),
                                              ("gpipe", [6, 6, 6]), ("2(P-p)+1", [6, 5, 3])])
def test_peak_micro_batches_in_flight_is_k_p(policy, expected):
    r = run([[4, 4], [8], [2, 6]], 6, FixedTimings([1, 1, 1], [2, 2, 2], [0.1, 0.1], activation_bytes=10), policy)
    by_stage = {}
    for d in r.devices:
        by_stage.setdefault(d.stage, set()).add(d.peak_in_flight_micro_batches)
    assert [by_stage[p] for p in range(3)] == [{k} for k in expected]
    d = next(d for d in r.devices if d.device == "d4")  # stage 2, 6 samples: Eq. 3 with y = 6
    assert d.peak_activation_bytes == expected[2] * 6 * 10


def test_busy_and_bubble_fractions_add_up():
    r = run([[4, 4], [8]], 4, FixedTimings([1, 2], [2, 3], [0.5], allreduce=[1.0, 0.0]))
    for d in r.devices:
        assert r.busy_fraction(d) + r.bubble_fraction(d) + d.allreduce_s / r.round_latency_s == pytest.approx(1.0)
    assert r.throughput_samples_per_s == 8 * 4 / r.round_latency_s


@pytest.mark.parametrize("groups, M", [([[8], [8]], 4), ([[3, 5], [8], [2, 2, 4]], 6), ([[1, 7], [4, 4]], 9)])
def test_blocking_transfers_are_never_faster_than_async(groups, M):
    timings = FixedTimings([1] * len(groups), [2] * len(groups), [1.5] * (len(groups) - 1))
    fast = run(groups, M, timings).round_latency_s
    slow = run(groups, M, timings, mode="blocking").round_latency_s
    assert slow >= fast


def test_profile_timings_on_one_device_reproduce_the_plans_estimate_exactly():
    profile = make_profile(layers=8, speeds=(1.0,), memory_gb=(8,))
    plan = make_plan(profile, PlanRequest(global_batch=64, micro_batch=16))
    _, r = simulate_plan(plan, profile)
    assert r.round_latency_s == pytest.approx(plan.prediction.round_latency_s, rel=1e-12)


def test_profile_timings_memory_matches_the_plans_eq3_prediction():
    profile = make_profile(layers=12, speeds=(1, 2, 3), memory_gb=(4, 4, 8))
    plan = make_plan(profile, PlanRequest(global_batch=256, micro_batch=32))
    schedule, r = simulate_plan(plan, profile)
    predicted = {d: m for s in plan.stages for d, m in zip(s.devices, s.memory_bytes)}
    for d in r.devices:
        assert d.peak_memory_bytes == pytest.approx(predicted[d.device], abs=1)


def test_unknown_device_in_profile_is_refused():
    profile = make_profile(layers=4, speeds=(1.0,))
    with pytest.raises(ValueError, match="not in the profile"):
        ProfileTimings(profile, make_schedule([[4], [4]], 2))


@pytest.mark.parametrize("seed", range(8))
def test_random_pipelines_respect_simple_bounds(seed):
    import random
    from tests.schedule.test_check import random_groups
    rng = random.Random(seed)
    P, M = rng.randint(1, 5), rng.choice([1, 3, 8, 16])
    groups = random_groups(rng, P, rng.randint(4, 16))
    timings = FixedTimings([rng.uniform(0.1, 2) for _ in range(P)], [rng.uniform(0.1, 4) for _ in range(P)],
                           [rng.uniform(0, 3) for _ in range(P - 1)], B=sum(groups[0]),
                           allreduce=[rng.uniform(0, 1) for _ in range(P)])
    policy = rng.choice(["1f1b-asteroid", "1f1b", "gpipe"])
    r = run(groups, M, timings, policy, trace=True)
    ks = make_schedule(groups, M, policy).stages
    for d in r.devices:
        assert r.round_latency_s >= d.compute_s + d.allreduce_s - 1e-9
        assert d.peak_in_flight_micro_batches <= ks[d.stage].warmup
    for link in r.links:
        assert r.round_latency_s >= link.busy_s - 1e-9
    # on every track, spans never overlap (one compute at a time, one send at a time per uplink)
    by_track = {}
    for s in r.spans:
        by_track.setdefault(s.track.split("->")[0] if "->" in s.track else ("dev", s.track), []).append(s)
    for spans in by_track.values():
        spans.sort(key=lambda s: s.start_s)
        for a, b in zip(spans, spans[1:]):
            assert b.start_s >= a.start_s + a.duration_s - 1e-9
    assert run(groups, M, timings, policy, mode="blocking").round_latency_s >= r.round_latency_s - 1e-9
