"""PURE: schedules as data (actions per device), one checker, and an event-driven simulator.

Imports neither torch nor fabric (a test checks), so `hppctl simulate` starts in well under a
second. Dependency direction: `hppctl.schedule` imports `hppctl.planner.cost` (the same per-layer
numbers as the estimate), never the other way round; `hppctl.planner.compare` takes the simulator
as an argument.

    schedule = schedule_for_plan(plan)          # actions per device (Asteroid 1F1B by default)
    check_schedule(schedule)                    # raises ScheduleError naming device, action, rule
    result = simulate(schedule, ProfileTimings(profile, schedule))
"""

from __future__ import annotations

from typing import Callable, Sequence

from hppctl.models.plan import HppPlan
from hppctl.models.profile import Profile
from hppctl.models.schedule import Action, Schedule
from hppctl.schedule.check import ScheduleError, check_schedule
from hppctl.schedule.generate import ABLATION_POLICIES, POLICIES, Durations, compute_order, generate, schedule_for_plan, warmups
from hppctl.schedule.simulate import Mode, SimResult, simulate
from hppctl.schedule.split_plan import split_backward_plan
from hppctl.schedule.timings import PlanTimings, ProfileTimings

__all__ = [
    "ABLATION_POLICIES", "POLICIES", "Action", "Durations", "Mode", "PlanTimings", "ProfileTimings", "Schedule",
    "ScheduleError", "SimResult", "check_schedule", "compute_order", "generate", "schedule_for_plan", "simulate",
    "simulate_plan", "simulated_round_latency", "split_backward_plan", "warmups",
]


def simulate_plan(plan: HppPlan, profile: Profile | None = None, *, policy: str | None = None,
                  warmup: Sequence[int] | None = None, mode: Mode = "async", trace: bool = False,
                  step_s: float = 0.0) -> tuple[Schedule, SimResult]:
    """Generate the plan's schedule, check it, and replay it (profile timings if given, else the plan's)."""
    schedule = schedule_for_plan(plan, policy, warmup)
    check_schedule(schedule)
    timings = ProfileTimings(profile, schedule, step_s=step_s) if profile is not None else PlanTimings(plan, step_s=step_s)
    return schedule, simulate(schedule, timings, mode=mode, trace=trace)


def simulated_round_latency(profile: Profile) -> Callable[[HppPlan], float]:
    """What `hppctl plan --compare` passes to `planner.compare` to rank strategies by simulation."""
    return lambda plan: simulate_plan(plan, profile)[1].round_latency_s
