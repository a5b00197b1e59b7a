"""Runtime of the asynchronous schedules (TiMePReSt's nf1b and the PipeDream baseline)."""

from __future__ import annotations

from functools import partial


def async_executor_class(schedule):
    """What the worker constructs in place of `Executor` for an asynchronous window (the schedule
    sets `micro_batches_per_update`): `AsyncExecutor` bound to the schedule's policy and N."""
    from hppctl.runtime.async_exec.executor import AsyncExecutor

    return partial(AsyncExecutor, policy=schedule.policy, micro_batches_per_update=schedule.micro_batches_per_update)
