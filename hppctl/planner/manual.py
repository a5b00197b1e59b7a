"""Plans written by hand (no profile): for benchmarks, tests and users who know the layout they want.

`manual_plan` fills the prediction fields with zeros: such a plan runs, but `hppctl plan --explain`
and the simulator have nothing to say about it, and its `profile_digest` is `manual`.
"""

from __future__ import annotations

from collections.abc import Sequence

from hppctl.models.plan import HppPlan, Prediction, StagePlan, TransferPlan
from hppctl.planner.cost import WARMUP_POLICIES

StageLayout = tuple[tuple[int, int], Sequence[str], Sequence[int]]
"""((start, end), devices, samples per device) of one stage."""


def manual_plan(model: str, stages: Sequence[StageLayout], *, global_batch: int, micro_batch: int,
                granularity: str = "fine", schedule: str = "1f1b-asteroid") -> HppPlan:
    """An HPP plan from explicit stages, head first."""
    M, P = global_batch // micro_batch, len(stages)
    warmup = WARMUP_POLICIES[schedule]
    return HppPlan(
        strategy="manual", model=model, granularity=granularity, profile_digest="manual",
        global_batch=global_batch, micro_batch=micro_batch, num_micro_batches=M, schedule=schedule,
        stages=[StagePlan(layers=list(layers), devices=list(devices), samples=list(samples),
                          warmup=warmup(P, p, M), forward_s=0.0, backward_s=0.0, allreduce_s=0.0,
                          memory_bytes=[0] * len(devices), memory_budget_bytes=[0] * len(devices))
                for p, (layers, devices, samples) in enumerate(stages)],
        transfers=[TransferPlan(after_stage=p, bytes_per_micro_batch=0, forward_s=0.0, backward_s=0.0)
                   for p in range(P - 1)],
        prediction=Prediction(round_latency_s=0.0, throughput_samples_per_s=0.0, dominant_step=0, peak_memory_ratio=0.0),
    )
