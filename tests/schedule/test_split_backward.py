"""Split backwards (I + W, zero-bubble): generated, checked, simulated (models/schedule.py's contract)."""

from __future__ import annotations

import random

import pytest

from hppctl.models.schedule import Action
from hppctl.schedule import Durations, ScheduleError, check_schedule, generate, simulate
from tests.schedule.factories import FixedTimings, make_schedule, make_stages
from tests.schedule.test_check import edit, move_after, move_before, random_groups, replace


def computes(schedule, device):
    return " ".join(str(a) for a in schedule.actions[device] if a.kind in ("F", "B", "I", "W"))


def test_two_stages_by_hand():
    """P = 2, M = 2, F = I = W = 1 (the head: I = 0, W = 2), 1F1B warmups (2, 1), no transfer time.
    Tail: F0 [1,2] I0 [2,3], then W0 [3,4] before F1 (K = 1 in flight), F1 [4,5] I1 [5,6] W1 [6,7].
    Head: F0 [0,1] F1 [1,2] I0 at 3, W0 [3,5] while I1's gradient is on its way, I1 at 6, W1 [6,8].
    Round 8 against 9 for whole backwards."""
    kw = dict(policy="1f1b", durations=Durations((1.0, 1.0), (2.0, 2.0), (0.0,), (1.0, 1.0)))
    whole, split = make_schedule([[4], [4]], 2, **kw), make_schedule([[4], [4]], 2, split_backward=True, **kw)
    check_schedule(split)
    assert computes(split, "d1") == "0F1[0:4] 0I1[0:4] 0W1[0:4] 1F1[0:4] 1I1[0:4] 1W1[0:4]"
    assert computes(split, "d0") == "0F0[0:4] 1F0[0:4] 0I0[0:4] 0W0[0:4] 1I0[0:4] 1W0[0:4]"
    timings = FixedTimings([1, 1], [2, 2], [0], B=4, weight=[1, 1])
    assert simulate(whole, timings).round_latency_s == 9
    assert simulate(split, timings).round_latency_s == 8


def test_the_gradient_chain_runs_on_input_halves():
    """Uniform P = 4, M = 8, F = I = W = 1: whole backwards take (M + P - 1)(F + B) = 33; split, each
    stage's input gradients leave a W earlier, so the first I reaches the head (P - 1) W sooner (30);
    with room for every micro-batch the Ws wait for the cool-down as well (27 = ZB-H1's
    M(F + I + W) + (P - 1)(F + I - W))."""
    timings = FixedTimings([1] * 4, [2] * 4, [0] * 3, B=4, weight=[1] * 4)
    kw = dict(policy="1f1b", durations=Durations((1.0,) * 4, (2.0,) * 4, (0.0,) * 3, (1.0,) * 4))
    assert simulate(make_schedule([[4]] * 4, 8, **kw), timings).round_latency_s == 33
    assert simulate(make_schedule([[4]] * 4, 8, split_backward=True, **kw), timings).round_latency_s == 30
    roomy = make_stages([[4]] * 4, 8, "1f1b")
    roomy = [s.model_copy(update={"in_flight_cap": 8}) for s in roomy]
    schedule = generate(roomy, micro_batch=4, num_micro_batches=8, policy="1f1b", split_backward=True,
                        durations=kw["durations"])
    check_schedule(schedule)
    assert simulate(schedule, timings).round_latency_s == 27


@pytest.mark.parametrize("seed", range(12))
def test_every_generated_split_schedule_checks_and_keeps_its_memory_cap(seed):
    rng = random.Random(seed)
    P, M, B = rng.randint(1, 6), rng.randint(1, 20), rng.randint(4, 16)
    groups = random_groups(rng, P, B, 3)
    durations = Durations(tuple(rng.uniform(0.1, 3) for _ in range(P)), tuple(rng.uniform(0.2, 6) for _ in range(P)),
                          tuple(rng.choice([0.0, rng.uniform(0, 4)]) for _ in range(P - 1)),
                          tuple(rng.uniform(0.05, 2) for _ in range(P)))
    policy = rng.choice(["1f1b-asteroid", "1f1b", "gpipe"])
    stages = make_stages(groups, M, policy)
    caps = [rng.randint(min(s.warmup, M), M) for s in stages]
    stages = [s.model_copy(update={"in_flight_cap": c}) for s, c in zip(stages, caps)]
    schedule = generate(stages, micro_batch=B, num_micro_batches=M, policy=policy, durations=durations,
                        split_backward=True)
    check_schedule(schedule)
    timings = FixedTimings(durations.forward_s, durations.backward_s, durations.transfer_s, B=B,
                           weight=durations.weight_s)
    result = simulate(schedule, timings)
    for d in result.devices:
        if d.samples:
            assert d.peak_in_flight_micro_batches <= caps[d.stage]
    for device, actions in schedule.actions.items():
        kinds = [a.kind for a in actions]
        assert "B" not in kinds and kinds.count("I") == kinds.count("W") == (M if kinds.count("F") else 0)


def split_base():
    # d0, d1: stage 0 (3 + 5 samples); d2: stage 1 (8); M = 3.
    return make_schedule([[3, 5], [8]], M=3, split_backward=True)


BROKEN = [
    ("W missing", "d2", lambda t: [x for x in t if x != "1W1[0:8]"], "each I needs its W"),
    ("W before its I", "d2", move_before("1W1[0:8]", "1I1[0:8]"), "weight half before the input half"),
    ("W twice", "d2", lambda t: t[:-1] + ["1W1[0:8]", t[-1]], "already computed"),
    ("W after the AllReduce", "d0", move_after("2W0[0:3]", "AR0"), "weight half after the AllReduce"),
    ("W after STEP", "d2", move_after("2W1[0:8]", "STEP1"), "STEP must be the last action"),
    ("B and I mixed", "d2", lambda t: [x for x in replace("0I1[0:8]", "0B1[0:8]")(t) if x != "0W1[0:8]"],
     "mixes whole backwards"),
    ("SG before its I", "d2", move_before("1SG1>d0[0:3]", "1I1[0:8]"), "sends gradients before the backward"),
]


@pytest.mark.parametrize("label, device, fn, needle", BROKEN, ids=[b[0] for b in BROKEN])
def test_checker_rejects_broken_split_schedules(label, device, fn, needle):
    check_schedule(split_base())
    with pytest.raises(ScheduleError) as err:
        check_schedule(edit(split_base(), device, fn))
    assert needle in str(err.value), str(err.value)


def test_asynchronous_schedules_may_not_split():
    schedule = split_base().model_copy(update={"micro_batches_per_update": 1})
    with pytest.raises(ScheduleError, match="asynchronous schedules do not split backwards"):
        check_schedule(schedule)


def test_weight_halves_take_no_version_tag():
    with pytest.raises(ValueError, match="takes no weight version"):
        Action.from_str("2W0[0:4]@1")
