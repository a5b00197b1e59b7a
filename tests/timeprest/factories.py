"""Small async schedules for the TiMePReSt tests: W one-device stages s0 … s{W-1}."""

from __future__ import annotations

from hppctl.models.schedule import Schedule, ScheduleStage
from hppctl.schedule.nf1b import AsyncDurations, build_async


def one_device_stages(W: int) -> list[ScheduleStage]:
    return [ScheduleStage(layers=[p, p + 1], devices=[f"s{p}"], samples=[1], warmup=1) for p in range(W)]


def nf1b(W: int, N: int, K: int, *, cap: int | None = None, durations: AsyncDurations | None = None,
         micro_batch: int = 4) -> Schedule:
    return build_async("nf1b", one_device_stages(W), micro_batch=micro_batch, micro_batches_per_update=N,
                       num_mini_batches=K, in_flight_cap=cap, durations=durations)


def pipedream(W: int, K: int, *, micro_batch: int = 8) -> Schedule:
    return build_async("pipedream", one_device_stages(W), micro_batch=micro_batch, micro_batches_per_update=1,
                       num_mini_batches=K)


def replace_action(schedule: Schedule, device: str, old: str, new: str) -> Schedule:
    """The schedule with one action of `device` (by text) replaced, or removed if `new` is ''."""
    actions = {d: [str(a) for a in acts] for d, acts in schedule.actions.items()}
    i = actions[device].index(old)
    if new:
        actions[device][i] = new
    else:
        del actions[device][i]
    return Schedule.model_validate({**schedule.model_dump(mode="json"), "actions": actions})
