"""Tier 1: the nf1b and pipedream generators, the checker's asynchronous rules, weight versions held."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hppctl.models.schedule import Action
from hppctl.schedule import ScheduleError, check_schedule
from hppctl.schedule.async_check import versions_held
from hppctl.schedule.async_version import simulated_version_difference
from hppctl.schedule.nf1b import AsyncDurations, default_in_flight_cap
from tests.timeprest.factories import nf1b, pipedream, replace_action


@pytest.mark.parametrize("text", ["3F1[0:8]@2", "0B0[0:4]@0", "12B3[2:6]@11"])
def test_version_tag_round_trips(text):
    assert str(Action.from_str(text)) == text


def test_version_tag_only_on_compute():
    with pytest.raises(ValueError, match="takes no weight version"):
        Action(kind="SA", stage=0, micro_batch=0, start=0, end=4, peer="s1", version=1)


@pytest.mark.parametrize("W,N,K", [(2, 2, 3), (3, 3, 5), (4, 2, 8), (4, 4, 6), (5, 3, 7), (6, 2, 9), (8, 7, 4)])
def test_nf1b_schedules_pass_the_checker(W, N, K):
    schedule = nf1b(W, N, K)
    check_schedule(schedule)
    assert schedule.micro_batches_per_update == N and schedule.num_micro_batches == K * N
    assert all(sum(a.kind == "STEP" for a in acts) == K for acts in schedule.actions.values())


@pytest.mark.parametrize("W,K", [(2, 3), (3, 5), (4, 8), (6, 4)])
def test_pipedream_schedules_pass_the_checker(W, K):
    check_schedule(pipedream(W, K))


def test_uneven_durations_keep_the_schedule_valid():
    durations = AsyncDurations((1.0, 3.0, 0.5), (2.0, 5.0, 1.0), (0.7, 0.2))
    check_schedule(nf1b(3, 2, 6, durations=durations))


def test_nf1b_runs_n_forwards_then_one_backward_in_steady_state():
    # W=4, N=4 (paper Fig. 7b): after the ramp every stage alternates 4 forwards and one
    # mini-batch backward (its 4 micro-batch backwards, then STEP).
    kinds = "".join("S" if a.kind == "STEP" else a.kind for a in nf1b(4, 4, 8).actions["s1"] if a.kind in ("F", "B", "STEP"))
    assert "FFFFBBBBS" * 3 in kinds


def test_nf1b_backward_priority_at_the_tail():
    # The tail backwards a mini-batch as soon as its N forwards are done: F F B B S F F B B S ...
    tail = [a for a in nf1b(4, 2, 5).actions["s3"] if a.kind in ("F", "B")]
    assert "".join(a.kind for a in tail[:8]) == "FFBBFFBB"


def test_pipedream_has_noam_forwards_then_1f1b():
    head = [a.kind for a in pipedream(4, 8).actions["s0"] if a.kind in ("F", "B")]
    assert "".join(head[:10]) == "FFFFBFBFBF"


# --- rules that fail ----------------------------------------------------------------------------

def _expect(schedule, match):
    with pytest.raises(ScheduleError, match=match):
        check_schedule(schedule)


def test_downstream_forward_with_another_version_is_refused():
    s = nf1b(4, 2, 6)
    f = next(a for a in s.actions["s2"] if a.kind == "F" and a.version == 1)
    _expect(replace_action(s, "s2", str(f), str(f).replace("@1", "@2")), "vertical sync")


def test_nf1b_backward_with_the_forward_version_is_refused():
    s = nf1b(4, 2, 6)
    b = next(a for a in s.actions["s3"] if a.kind == "B" and a.version == 2)
    _expect(replace_action(s, "s3", str(b), str(b).replace("@2", "@0")), "no stash")


def test_pipedream_backward_with_the_latest_version_is_refused():
    s = pipedream(3, 6)
    b = next(a for a in s.actions["s0"] if a.kind == "B" and a.micro_batch == 3)
    latest = b.version + 1
    _expect(replace_action(s, "s0", str(b), str(b).replace(f"@{b.version}", f"@{latest}")),
            "weight stashing|has made only")


def test_missing_step_is_refused():
    s = nf1b(3, 2, 4)
    _expect(replace_action(s, "s1", "STEP1", ""), "STEP")


def test_untagged_forward_is_refused():
    s = nf1b(3, 2, 4)
    _expect(replace_action(s, "s1", "0F1[0:4]@0", "0F1[0:4]"), "tags every F and B")


def test_synchronous_round_with_a_tag_is_refused():
    from tests.schedule.factories import make_schedule

    s = make_schedule([[4], [4]], 2)
    _expect(replace_action(s, "d1", "0F1[0:4]", "0F1[0:4]@0"), "one weight version")


def test_in_flight_cap_is_enforced():
    s = nf1b(4, 2, 8, cap=2)
    check_schedule(s)
    loose = nf1b(4, 2, 8, cap=5)
    tight = loose.model_copy(update={"in_flight_cap": 2})
    _expect(tight, "mini-batches in flight, the cap is 2")


# --- versions and the cap -------------------------------------------------------------------------

def test_pipedream_stashes_w_versions_nf1b_keeps_one_at_the_head():
    assert versions_held(pipedream(4, 8))["s0"] == 4       # NOAM = 4 mini-batches, each its version
    assert versions_held(nf1b(4, 4, 8))["s0"] == 1          # backward with the latest: no stash
    held = versions_held(nf1b(4, 4, 8))
    assert all(held[f"s{p}"] <= held[f"s{p + 1}"] for p in range(3))  # only forwards keep old versions


@pytest.mark.parametrize("W", range(2, 7))
@pytest.mark.parametrize("N", range(2, 7))
def test_default_cap_costs_no_throughput(W, N):
    capped = simulated_version_difference(W, N, K=10)
    free = simulated_version_difference(W, N, K=10, in_flight_cap=10**6)
    assert capped.round_time_points == free.round_time_points
    assert default_in_flight_cap(W, N) <= W


def test_a_tighter_cap_costs_throughput():
    capped = simulated_version_difference(8, 2, K=10, in_flight_cap=2)
    free = simulated_version_difference(8, 2, K=10, in_flight_cap=10**6)
    assert capped.round_time_points > free.round_time_points


def test_async_modules_are_pure():
    code = ("import sys, hppctl.schedule.nf1b, hppctl.schedule.async_check, hppctl.schedule.async_version; "
            "assert 'torch' not in sys.modules and 'fabric' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_simulate_cli_replays_an_async_window(cli, tmp_path):
    import json

    from hppctl.planner.manual import manual_plan
    from hppctl.schedule.nf1b import SIMULATED_WINDOW
    from hppctl.store import save

    plan = manual_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 4), ["b"], [4]), ((4, 5), ["c"], [4])],
                       global_batch=8, micro_batch=4)
    save(tmp_path / "plan.yaml", plan)
    for policy, N in (("nf1b", 2), ("pipedream", 1)):
        code, out, err = cli("simulate", "--plan", tmp_path / "plan.yaml", "--policy", policy, "--json")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["policy"] == policy
        held = [d["weight_versions"] for d in doc["devices"]]
        assert held == ([1, 2, 3] if policy == "nf1b" else [3, 3, 3])  # nf1b: only forwards keep old versions
        code, out, _ = cli("simulate", "--plan", tmp_path / "plan.yaml", "--policy", policy)
        assert code == 0 and "simulated window of 16 mini-batches" in out
    from hppctl.schedule import schedule_for_plan

    schedule = schedule_for_plan(plan, "nf1b")
    assert schedule.num_micro_batches == SIMULATED_WINDOW * 2 and schedule.micro_batches_per_update == 2


def test_simulate_text_of_a_plan_without_timings(cli, tmp_path):
    # A hand-written plan (planner.manual.manual_plan) has zero timings: the simulated round takes
    # 0 s, and the link table divided by it (ZeroDivisionError before the fix).
    from hppctl.planner.manual import manual_plan
    from hppctl.store import save

    plan = manual_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])], global_batch=8, micro_batch=4)
    save(tmp_path / "plan.yaml", plan)
    code, out, err = cli("simulate", "--plan", tmp_path / "plan.yaml")
    assert code == 0, err
    assert "simulated round latency 0.000 s" in out
