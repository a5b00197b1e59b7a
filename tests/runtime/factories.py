"""Small readable plans and clusters for runtime tests (made by hand, not by the planner)."""

from __future__ import annotations

from hppctl.models.cluster import ClusterSpec, DeviceSpec
from hppctl.models.plan import HppPlan, Prediction, StagePlan, TransferPlan
from hppctl.planner.cost import WARMUP_POLICIES


def make_plan(model: str, stages: list[tuple[tuple[int, int], list[str], list[int]]], *, global_batch: int,
              micro_batch: int, granularity: str = "fine", schedule: str = "1f1b-asteroid") -> HppPlan:
    """`stages`: ((start, end), devices, samples per device) from head to tail."""
    M, P = global_batch // micro_batch, len(stages)
    warmup = WARMUP_POLICIES[schedule]
    return HppPlan(
        strategy="manual", model=model, granularity=granularity, profile_digest="sha256:manual",
        global_batch=global_batch, micro_batch=micro_batch, num_micro_batches=M, schedule=schedule,
        stages=[StagePlan(layers=list(layers), devices=list(devices), samples=list(samples),
                          warmup=warmup(P, p, M), forward_s=1.0, backward_s=2.0, allreduce_s=0.0,
                          memory_bytes=[0] * len(devices), memory_budget_bytes=[10**9] * len(devices))
                for p, (layers, devices, samples) in enumerate(stages)],
        transfers=[TransferPlan(after_stage=p, bytes_per_micro_batch=0, forward_s=0.1, backward_s=0.1)
                   for p in range(P - 1)],
        prediction=Prediction(round_latency_s=1.0, throughput_samples_per_s=1.0, dominant_step=0, peak_memory_ratio=0.1),
    )


def local_cluster(*names: str) -> ClusterSpec:
    return ClusterSpec(name="local", devices=[DeviceSpec(name=n, local=True) for n in names])
