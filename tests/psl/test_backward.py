"""The exact per-helper schedules: the paper's Fig. 4 worked example, Algorithm 2 vs largest tail first."""

import numpy as np
import pytest

from hppctl.planner.psl.backward import FREE, algorithm2, blocks, fcfs_on_slots, largest_tail_first

# Fig. 4 (5 clients, 1 helper). The figure itself is not in the text; this instance is rebuilt from
# everything the text states: FCFS blocks β1 = {1,4,2,3} with s = 0, e = 8 and β2 = {5} with s = 9,
# e = 10; ℓ = 4 from 9 = min{8+5, 8+3, 8+8, 8+1} (so r′ = 5, 3, 8, 1 for clients 1, 2, 3, 4);
# sub-blocks {1} and {2, 3} with e = 7 and ℓ′ = 2 from 10 = min{7+3, 7+8}; client 3 is processed
# on arrival and finishes last; optimal makespan 14.
RELEASE = {1: 0, 2: 3, 3: 4, 4: 1, 5: 9}
WORK = {1: 2, 2: 2, 3: 2, 4: 2, 5: 1}
TAIL = {1: 5, 2: 3, 3: 8, 4: 1, 5: 2}


def makespan(slots: dict[int, list[int]]) -> int:
    return max(max(s) + 1 + TAIL[j] for j, s in slots.items())


def ltf(release, work, tail, busy=()):
    jobs = sorted(release)
    owner = np.full(30, FREE, dtype=np.int64)
    owner[list(busy)] = 99
    owner, finish = largest_tail_first(owner, jobs, [release[j] for j in jobs], [work[j] for j in jobs],
                                       [tail[j] for j in jobs], jobs)
    return owner, finish


def test_fig4_fcfs_blocks_are_the_papers():
    first = fcfs_on_slots(list(RELEASE), RELEASE, WORK, list(range(30)))
    assert [(jobs, span[0], span[-1] + 1) for jobs, span in blocks(first, list(range(30)))] == \
        [([1, 4, 2, 3], 0, 8), ([5], 9, 10)]
    assert makespan(first) == 16  # FCFS: client 3 ends at 8, plus r′ = 8


def test_fig4_algorithm2_reproduces_the_worked_example():
    slots, trace = algorithm2(RELEASE, WORK, TAIL, list(range(30)))
    top = [t for t in trace if t["depth"] == 0]
    assert [(t["jobs"], t["s"], t["e"], t["l"]) for t in top] == [([1, 4, 2, 3], 0, 8, 4), ([5], 9, 10, 5)]
    sub = {tuple(t["jobs"]): (t["e"], t["l"]) for t in trace if t["depth"] == 1}
    assert sub == {(1,): (2, 1), (2, 3): (7, 2)}
    assert slots[4] == [2, 7]           # client 4 fills the gaps
    assert slots[3] == [4, 5]           # client 3 runs on arrival
    assert makespan(slots) == 14
    assert max(slots, key=lambda j: max(slots[j]) + 1 + TAIL[j]) == 3  # and finishes last


def test_fig4_largest_tail_first_is_optimal_too():
    _, finish = ltf(RELEASE, WORK, TAIL)
    assert max(finish[j] + TAIL[j] for j in finish) == 14
    assert finish[3] == 6


def brute_force(release, work, tail, free):
    """Exhaustive: every way to give free slots to released jobs (idling never helps)."""
    from functools import lru_cache
    jobs = sorted(release)

    @lru_cache(maxsize=None)
    def best(k, left):
        if all(x == 0 for x in left):
            return -np.inf
        if k == len(free):
            return np.inf
        t = free[k]
        options = [n for n, j in enumerate(jobs) if left[n] > 0 and release[j] <= t]
        if not options:
            return best(k + 1, left)
        out = np.inf
        for n in options:
            new = list(left)
            new[n] -= 1
            cost = t + 1 + tail[jobs[n]] if new[n] == 0 else -np.inf
            out = min(out, max(cost, best(k + 1, tuple(new))))
        return out

    return best(0, tuple(work[j] for j in jobs))


@pytest.mark.parametrize("seed", range(40))
def test_algorithm2_and_largest_tail_first_are_optimal_on_random_helpers(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 5))
    release = {j: int(rng.integers(0, 7)) for j in range(n)}
    work = {j: int(rng.integers(1, 4)) for j in range(n)}
    tail = {j: int(rng.integers(0, 10)) for j in range(n)}
    busy = sorted({int(t) for t in rng.integers(0, 12, size=int(rng.integers(0, 4)))})  # slots the forward pass took
    free = [t for t in range(40) if t not in busy]
    optimum = brute_force(release, work, tail, free)
    slots, _ = algorithm2(release, work, tail, free)
    assert max(max(s) + 1 + tail[j] for j, s in slots.items()) == optimum
    assert all(sorted(s) == s and min(s) >= release[j] and len(s) == work[j] for j, s in slots.items())
    owner, finish = ltf(release, work, tail, busy)
    assert max(finish[j] + tail[j] for j in finish) == optimum
    assert not any(owner[t] not in (99,) for t in busy)  # busy slots untouched
