"""`forked_map`: half a loop's items in a forked child, results in item order, a failing child's
items run here (hppctl/planner/forked.py)."""

from __future__ import annotations

import os
import signal

import pytest

from hppctl.planner.forked import forked_map


def counting_side():
    """A side that numbers the items it has seen: state a side keeps across its own items only."""
    seen = []

    def f(x):
        seen.append(x)
        return (x * x, os.getpid(), len(seen))

    return f


def test_results_come_in_item_order_half_of_them_from_a_child():
    results = forked_map(counting_side, range(7))
    assert [r[0] for r in results] == [x * x for x in range(7)]
    here = {r[1] for r in results[0::2]}
    there = {r[1] for r in results[1::2]}
    assert here == {os.getpid()} and len(there) == 1 and there != here
    # each process's side counts only its own items: 1, 2, 3, 4 here and 1, 2, 3 in the child
    assert [r[2] for r in results] == [1, 1, 2, 2, 3, 3, 4]


@pytest.mark.parametrize("items", [[], [5]])
def test_fewer_than_two_items_run_here(items):
    assert [r[1] for r in forked_map(counting_side, items)] == [os.getpid()] * len(items)


@pytest.mark.parametrize("how", ["raises", "killed", "exits-early"])
def test_a_child_that_fails_sends_nothing_and_its_items_run_here_on_a_fresh_side(how):
    parent = os.getpid()

    def side():
        f = counting_side()

        def g(x):
            if os.getpid() != parent:
                if how == "raises":
                    raise RuntimeError("child failed")
                if how == "killed":
                    os.kill(os.getpid(), signal.SIGKILL)
                os._exit(0)
            return f(x)

        return g

    results = forked_map(side, range(5))
    assert [r[0] for r in results] == [0, 1, 4, 9, 16]
    assert {r[1] for r in results} == {parent}
    assert [r[2] for r in results] == [1, 1, 2, 2, 3]  # the child's items counted by a side of their own


def test_an_error_here_is_raised_after_the_child_is_gone_even_while_it_writes():
    """The parent fails while the child still has more to send than a pipe holds: the parent closes
    its end, the child's write fails and it exits, and the parent's error comes out (no hang)."""
    parent = os.getpid()

    def side():
        def f(x):
            if os.getpid() == parent:
                raise ValueError("here")
            return b"x" * (1 << 20)  # more than a pipe buffers

        return f

    before = children()
    with pytest.raises(ValueError, match="here"):
        forked_map(side, range(4))
    assert children() == before  # the child was waited for: not even a zombie is left


def children() -> set[int]:
    """This process's children (zombies included), from /proc."""
    found = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            found |= {int(pid) for pid in f.read().split()}
    return found


SPLIT_OR_NOT = """
import json, os
from hppctl.models.plan import PlanRequest
from hppctl.planner import forked
from tests.conftest import make_profile

forks, fork = [], os.fork


def counting_fork():
    pid = fork()
    if pid:
        forks.append(pid)
    return pid


{setup}

os.fork = counting_fork
alone = results()
assert not forks  # not allowed: a library caller plans in one process
with forked.allowed():
    split = results()
print(json.dumps({{"same": split == alone, "forks": len(forks), "results": len(alone)}}))
"""
"""A script that runs `results()` (defined by `setup`) in one process, then where forking is allowed,
and prints whether the two agree and how many forks the second made."""


def split_or_not(setup: str) -> dict:
    """SPLIT_OR_NOT in a process of one thread (a subprocess: pytest-xdist's workers run threads, and a
    process with a second thread never forks)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", SPLIT_OR_NOT.format(setup=setup)], capture_output=True, text=True,
                          cwd=root, timeout=300, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_large_plan_forks_where_allowed_and_gives_the_one_process_plans():
    """A 400-layer model's asteroid, asteroid-paper and pp plans split their loops with forked children
    under `forked.allowed()`, and equal the one-process plans."""
    result = split_or_not("""
from hppctl.planner import make_plan

profile = make_profile(layers=400, speeds=[1.0, 2.0, 3.0, 1.5, 2.5, 0.8], seed=1)  # 79 800 pairs
request = PlanRequest(global_batch=256, micro_batch=16)


def results():
    found = {}
    for strategy in ("asteroid", "asteroid-paper", "pp"):
        plan = make_plan(profile, request, strategy).model_dump(mode="json")
        plan.pop("planning_time_s")
        found[strategy] = plan
    return found
""")
    assert result["same"] and result["forks"] >= 3, result


def test_a_process_with_a_second_thread_never_forks():
    import threading

    from hppctl.planner import forked

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        with forked.allowed():
            assert not forked.worth_forking(10**9)
    finally:
        stop.set()
        thread.join()


def test_compare_splits_its_strategies_and_micro_batches_and_ranks_the_same_rows():
    """`--compare` (a micro-batch given, and auto) and `--micro-batch auto`: every other strategy or
    micro-batch planned in a forked child where allowed (one fork each); the rows, their plans,
    simulated figures and order, and the auto plan with its record of the choice, equal the
    one-process ones."""
    result = split_or_not("""
from hppctl.planner import compare
from hppctl.planner.micro_batch import compare_auto, make_auto_plan
from hppctl.schedule import simulated_round_latency

profile = make_profile(layers=12, speeds=[1.0, 2.0, 3.0, 1.5], seed=3)  # small: Bi-Partition's DPs grow as L^4
simulate = simulated_round_latency(profile)


def results():
    found = []
    for row in compare(profile, PlanRequest(global_batch=64, micro_batch=8), simulate) + compare_auto(profile, 64, simulate):
        plan = row.plan.model_dump(mode="json") if row.plan else None
        if plan:
            plan.pop("planning_time_s")
        found.append([row.strategy, plan, row.simulated_round_latency_s, row.planning_time_s > 0])
    auto = make_auto_plan(profile, 64, "asteroid", simulate).model_dump(mode="json")
    auto.pop("planning_time_s")
    return found + [auto]
""")
    assert result == {"same": True, "forks": 3, "results": 21}, result


def test_no_split_inside_a_split():
    """Each side of `forked_map` runs its items with forking disallowed (the other side keeps the second
    CPU busy), and the parent may fork again afterwards."""
    from hppctl.planner import forked

    with forked.allowed():
        seen = forked_map(lambda: lambda x: (x, forked._ALLOWED.get()), [0, 1, 2])
        after = forked._ALLOWED.get()
    assert [allowed for _, allowed in seen] == [False, False, False] and after is True
