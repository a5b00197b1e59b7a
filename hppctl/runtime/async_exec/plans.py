"""The asynchronous window a plan runs under `hppctl run`: one epoch of nf1b or pipedream.

The window is an epoch: K = ⌊training samples / mini-batch⌋ mini-batches, so a round of the run is
an epoch and the runtime's checkpoint every round (`--checkpoint-every 1`) is the paper's per-stage
checkpoint at the end of every epoch (seeds/003 §4.3). The mini-batch is the plan's global batch;
nf1b splits it into the plan's micro-batches, pipedream does not split it.
"""

from __future__ import annotations

from hppctl.errors import BadInput
from hppctl.models.plan import HppPlan
from hppctl.models.schedule import Schedule
from hppctl.schedule import check_schedule
from hppctl.schedule.nf1b import ASYNC_POLICIES, async_schedule_for_plan


def mini_batches_per_epoch(plan: HppPlan, dataset: str) -> int:
    from hppctl.runtime.data import load_data

    samples = len(load_data(dataset, plan.model).train)
    if samples < plan.global_batch:
        raise BadInput(f"--dataset {dataset}: {samples} training samples, fewer than one mini-batch ({plan.global_batch})")
    return samples // plan.global_batch


def epoch_schedule(plan: HppPlan, policy: str, dataset: str, *, in_flight_cap: int | None = None) -> Schedule:
    """The checked window of one epoch; the order follows the plan's E_f/E_b (unit time-points for a
    hand-written plan, which has none)."""
    if policy not in ASYNC_POLICIES:
        raise BadInput(f"--schedule: {policy!r} is not an asynchronous schedule ({', '.join(ASYNC_POLICIES)})")
    crowded = [p for p, s in enumerate(plan.stages) if len(s.devices) != 1]
    if crowded:
        raise BadInput(f"--schedule {policy}: needs one device per stage; stage {crowded[0]} has "
                       f"{', '.join(plan.stages[crowded[0]].devices)}")
    unit = all(s.forward_s == 0 for s in plan.stages)
    schedule = async_schedule_for_plan(plan, policy, num_mini_batches=mini_batches_per_epoch(plan, dataset),
                                       in_flight_cap=in_flight_cap, unit=unit)
    check_schedule(schedule)
    return schedule
