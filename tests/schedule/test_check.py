"""The checker: accepts every generated schedule, rejects each kind of broken one with a precise message."""

import random

import pytest

from hppctl.models.schedule import Action
from hppctl.schedule import ABLATION_POLICIES, Durations, ScheduleError, check_schedule
from tests.schedule.factories import make_schedule

POLICIES = ["1f1b-asteroid", "1f1b", "gpipe", "2(P-p)", "2(P-p)+1"]


def random_groups(rng: random.Random, P: int, B: int, max_group: int = 4) -> list[list[int]]:
    """P stages of 1..max_group devices each, with uneven (sometimes zero) allocations summing to B."""
    groups = []
    for _ in range(P):
        g = rng.randint(1, max_group)
        cuts = sorted(rng.randint(0, B) for _ in range(g - 1))
        groups.append([b - a for a, b in zip([0, *cuts], [*cuts, B])])
    return groups


# (P, group sizes <= 4, M, B, seed): the acceptance envelope P <= 8, groups <= 4, M <= 64, uneven.
CASES = [(1, 1, 1, 4, 0), (1, 4, 7, 16, 1), (2, 1, 1, 8, 2), (2, 4, 64, 16, 3), (3, 2, 5, 8, 4),
         (4, 4, 16, 32, 5), (5, 3, 9, 12, 6), (6, 4, 3, 7, 7), (7, 2, 33, 10, 8), (8, 1, 8, 8, 9),
         (8, 4, 64, 64, 10), (8, 4, 64, 13, 11), (8, 3, 2, 24, 12),
         (3, 4, 1, 16, 13)]  # M = 1 with replicated stages: what --micro-batch auto gives dp


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("P, group, M, B, seed", CASES)
def test_checker_accepts_every_generated_schedule(P, group, M, B, seed, policy):
    rng = random.Random(seed)
    groups = random_groups(rng, P, B, group)
    # Random positive durations change where transfers sit; every placement must stay valid.
    durations = Durations(tuple(rng.uniform(0.1, 3) for _ in range(P)), tuple(rng.uniform(0.1, 6) for _ in range(P)),
                          tuple(rng.choice([0.0, rng.uniform(0, 4)]) for _ in range(P - 1)))
    check_schedule(make_schedule(groups, M, policy, durations=durations if seed % 2 else None))


@pytest.mark.slow
def test_checker_accepts_the_whole_envelope():
    """Every P <= 8 and max group 1..4 with every policy for M in a spread up to 16, and with M = 64
    under one policy each (taking turns, so each policy meets M = 64 on several shapes): 992
    schedules. The time goes with the sum of the Ms: every policy at M = 64 doubled it. Odd and
    prime Ms are covered by 3 and 5, and by the random cases above."""
    for P in range(1, 9):
        for group in range(1, 5):
            for M in (1, 2, 3, 5, 8, 16, 64):
                for policy in POLICIES if M < 64 else [POLICIES[(P + group) % len(POLICIES)]]:
                    rng = random.Random(f"{P}-{group}-{M}-{policy}")
                    groups = random_groups(rng, P, rng.randint(group, 32), group)
                    durations = Durations(tuple(rng.uniform(0.1, 3) for _ in range(P)),
                                          tuple(rng.uniform(0.1, 6) for _ in range(P)),
                                          tuple(rng.choice([0.0, rng.uniform(0, 4)]) for _ in range(P - 1)))
                    check_schedule(make_schedule(groups, M, policy, durations=durations))


@pytest.mark.parametrize("ks", [[1, 1, 1], [7, 2, 1], [64, 6, 1], [3, 3, 3], [6, 1, 1]])
def test_checker_accepts_any_non_increasing_warmup(ks):
    check_schedule(make_schedule([[2, 3], [5], [1, 1, 3]], M=6, ks=ks))


@pytest.mark.parametrize("ks", [[2, 7, 1], [1, 1, 2]])
def test_increasing_warmup_is_refused_by_the_generator(ks):
    with pytest.raises(ValueError, match="must not increase from head to tail"):
        make_schedule([[2, 3], [5], [1, 1, 3]], M=6, ks=ks)


def test_checker_finds_the_compute_order_deadlock_of_an_increasing_warmup():
    # Hand-build K = (1, 3): stage 0 waits for the gradient of 0 before forwarding 1, stage 1 waits
    # for three forwards before its first backward.
    s = make_schedule([[4], [4]], M=3, ks=[3, 3])
    d0 = "0F0[0:4] 0SA0>d1[0:4] 0RG0<d1[0:4] 0B0[0:4] 1F0[0:4] 1SA0>d1[0:4] 1RG0<d1[0:4] 1B0[0:4] " \
         "2F0[0:4] 2SA0>d1[0:4] 2RG0<d1[0:4] 2B0[0:4] STEP0"
    broken = edit(s, "d0", lambda _: d0.split())
    with pytest.raises(ScheduleError, match="deadlock under blocking send/receive: cycle"):
        check_schedule(broken)


def test_ablation_policies_are_all_covered():
    assert set(POLICIES) | {"2(P-p)-1", "P-p"} >= set(ABLATION_POLICIES)


# --- broken schedules --------------------------------------------------------------------------------

def base():
    # d0, d1: stage 0 (3 + 5 samples); d2: stage 1 (8); M = 3, Asteroid K = (3, 1).
    return make_schedule([[3, 5], [8]], M=3)


def edit(schedule, device, fn):
    texts = [str(a) for a in schedule.actions[device]]
    texts = fn(texts)
    actions = dict(schedule.actions)
    actions[device] = [Action.from_str(t) for t in texts]
    return schedule.model_copy(update={"actions": actions})


def replace(old, new):
    def fn(texts):
        assert old in texts, texts
        return [new if t == old else t for t in texts]
    return fn


def drop(old):
    return lambda texts: [t for t in texts if t != old]


def move_after(item, anchor):
    def fn(texts):
        texts = [t for t in texts if t != item]
        i = texts.index(anchor)
        return texts[:i + 1] + [item] + texts[i + 1:]
    return fn


def move_before(item, anchor):
    def fn(texts):
        texts = [t for t in texts if t != item]
        i = texts.index(anchor)
        return texts[:i] + [item] + texts[i:]
    return fn


def swap_ranges(texts):
    swap = {"0RA1<d0[0:3]": "0RA1<d0[3:8]", "0RA1<d1[3:8]": "0RA1<d1[0:3]",
            "0SG1>d0[0:3]": "0SG1>d0[3:8]", "0SG1>d1[3:8]": "0SG1>d1[0:3]"}
    return [swap.get(t, t) for t in texts]


BROKEN = [
    ("wrong stage", "d0", replace("1F0[0:3]", "1F1[0:3]"), "names stage 1, but d0 is in stage 0"),
    ("no such micro-batch", "d0", replace("1F0[0:3]", "7F0[0:3]"), "micro-batch 7 does not exist"),
    ("range past B", "d1", replace("1F0[3:8]", "1F0[3:9]"), "ends past the micro-batch"),
    ("range not owned", "d0", replace("1F0[0:3]", "1F0[0:4]"), "outside the range [0:3) d0 owns"),
    ("peer in wrong stage", "d0", replace("0SA0>d2[0:3]", "0SA0>d1[0:3]"), "peer d1 is not a device of stage 1"),
    ("send past the tail", "d2", replace("0F1[0:8]", "0SA1>d0[0:8]"), "stage 1 has no next stage"),
    ("forward missing", "d0", drop("2F0[0:3]"), "samples [0:3) of micro-batch 2 are never forwarded"),
    ("forward twice", "d0", lambda t: ["1F0[0:3]"] + t, "forwarded twice"),
    ("backward missing", "d2", drop("1B1[0:8]"), "never backwarded"),
    ("backward before forward", "d2", move_before("2B1[0:8]", "2F1[0:8]"), "backward before the forward"),
    ("forward before its input", "d2", move_before("1F1[0:8]", "1RA1<d0[0:3]"), "before its activations [0:8) are received"),
    ("backward before its gradient", "d0", move_before("1B0[0:3]", "1RG0<d2[0:3]"), "before its gradients [0:3) are received"),
    ("send before its forward", "d0", move_before("1SA0>d2[0:3]", "1F0[0:3]"), "sends activations before the forward"),
    ("gradient send before backward", "d2", move_before("1SG1>d0[0:3]", "1B1[0:8]"), "sends gradients before the backward"),
    ("receive twice", "d2", lambda t: t[:t.index("1F1[0:8]")] + ["1RA1<d1[3:8]"] + t[t.index("1F1[0:8]"):],
     "received activations [0:3, 3:8, 3:8] do not tile the forwarded samples [0:8]"),
    ("gradient to the wrong device", "d2", replace("1SG1>d0[0:3]", "1SG1>d1[0:3]"), "not sent back to where the activations came from"),
    ("gradient from the wrong device", "d0", replace("1RG0<d2[0:3]", "1RG0<d1[0:3]"), "peer d1 is not a device of stage 1"),
    ("send without receive", "d2", swap_ranges, "has no matching receive"),
    ("allreduce missing", "d0", drop("AR0"), "needs exactly one AR0, found 0"),
    ("allreduce twice", "d1", lambda t: t[:-1] + ["AR0", "STEP0"], "needs exactly one AR0, found 2"),
    ("allreduce before last backward", "d0", move_before("AR0", "2B0[0:3]"), "backward after the AllReduce"),
    ("allreduce on a single device", "d2", lambda t: t[:-1] + ["AR1", "STEP1"], "AllReduce on a single-device stage"),
    ("step not last", "d2", move_before("STEP1", "2SG1>d1[3:8]"), "STEP must be the last action"),
    ("step missing", "d0", drop("STEP0"), "STEP must be the last action, exactly once (found 0)"),
    ("deadlock", "d2", move_after("1RA1<d0[0:3]", "0SG1>d1[3:8]"), "deadlock under blocking send/receive: cycle"),
]


@pytest.mark.parametrize("label, device, fn, needle", BROKEN, ids=[b[0] for b in BROKEN])
def test_checker_rejects_broken_schedules(label, device, fn, needle):
    check_schedule(base())  # the unbroken one is fine
    with pytest.raises(ScheduleError) as err:
        check_schedule(edit(base(), device, fn))
    assert needle in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_deadlock_report_names_the_cycle():
    # Two stages on one device each: d1 waits to send the gradient of 0 (and then to receive the
    # activations of 2) before it receives the activations of 1, which d0 is blocked sending.
    s = make_schedule([[4], [4]], M=3)
    broken = edit(s, "d1", move_after("1RA1<d0[0:4]", "0SG1>d0[0:4]"))
    with pytest.raises(ScheduleError, match=r"cycle d0 at 1SA0>d1\[0:4\] waits for d1, d1 at 2RA1<d0\[0:4\] waits for d0"):
        check_schedule(broken)


def test_blocking_order_matters_but_async_would_not_need_it():
    # Every ordering the generator emits survives rendezvous semantics, including the GPipe one whose
    # sends all precede the receives of gradients.
    check_schedule(make_schedule([[2, 2], [1, 3], [4]], M=8, policy="gpipe"))
