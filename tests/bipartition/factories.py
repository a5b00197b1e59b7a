"""Hand-made Bi-Partition plans for schedule and runtime tests (the planner is tested on its own)."""

from __future__ import annotations

from hppctl.models.plan import HppPlan, Prediction, StagePlan, TransferPlan
from hppctl.planner.cost import asteroid_warmup


def bi_plan(model: str, forward: list[int], backward: list[int], devices: list[str], *, global_batch: int,
            micro_batch: int, granularity: str = "fine") -> HppPlan:
    """One single-device stage per worker; `forward`/`backward` are the cut sequences 0 = c_0 <= ... <= c_W = L."""
    W, M = len(devices), global_batch // micro_batch
    stages = []
    for w, d in enumerate(devices):
        f, b = [forward[w], forward[w + 1]], [backward[w], backward[w + 1]]
        stages.append(StagePlan(layers=f, backward_layers=None if f == b else b, devices=[d], samples=[micro_batch],
                                warmup=asteroid_warmup(W, w, M), forward_s=1.0, backward_s=2.0, allreduce_s=0.0,
                                memory_bytes=[0], memory_budget_bytes=[10**9]))
    return HppPlan(
        strategy="manual", model=model, granularity=granularity, profile_digest="sha256:manual",
        global_batch=global_batch, micro_batch=micro_batch, num_micro_batches=M, stages=stages,
        transfers=[TransferPlan(after_stage=w, bytes_per_micro_batch=0, forward_s=0.1, backward_s=0.1)
                   for w in range(W - 1)],
        prediction=Prediction(round_latency_s=1.0, throughput_samples_per_s=1.0, dominant_step=0, peak_memory_ratio=0.1),
    )
