"""What a checkpoint records about the run that wrote it: the plan's identity and lineage, and the
settings a resuming run must share (checkpoint.py checks them, session.py writes them; a leaf module)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from hppctl.models.plan import HppPlan
from hppctl.runtime.config import TrainOptions


@dataclass(frozen=True)
class Lineage:
    """Where a run's plan comes from, written into every checkpoint: so that `--resume` with the plan a
    run was started with continues on the plan fault tolerance re-planned it to (checkpoint.py:
    `plan_to_resume`)."""

    origin: str
    """`plan_digest` of the plan the run was first started with."""
    lost: tuple[str, ...] = ()
    """Devices re-planned without since then, in the order they were lost."""

    def as_meta(self) -> dict:
        return {"origin_plan": self.origin, "lost": list(self.lost)}


def run_fingerprint(plan: HppPlan, options: TrainOptions) -> dict:
    """What a checkpoint must share with a run that resumes from it."""
    keep = ("dataset", "seed", "optimizer", "lr", "momentum", "weight_decay")
    return {"plan": plan_document(plan), **{k: getattr(options, k) for k in keep}, "lr_schedule": _schedule_text(options)}


def resume_fingerprint(plan: HppPlan, options: TrainOptions) -> dict:
    """What the newest round must share with a run resuming from it: `run_fingerprint`, but for the
    learning-rate schedule when the run starts a new schedule cycle (`--more-rounds`: the cycle
    begins at the resumed round, whatever the previous one was)."""
    keep = run_fingerprint(plan, options)
    if options.schedule_start > 0:
        del keep["lr_schedule"]
    return keep


def _schedule_text(options: TrainOptions) -> str | None:
    """The learning-rate schedule as a checkpoint records it: None for a constant rate (what
    checkpoints written before schedules existed hold); a cosine's total rounds are part of it, and
    the round its cycle started from when that is not 0 (`--more-rounds`)."""
    if options.lr_schedule == "constant" and not options.warmup_rounds:
        return None
    parts = [options.lr_schedule] + ([f"{options.rounds} rounds"] if options.lr_schedule == "cosine" else [])
    parts += [f"{options.warmup_rounds} warm-up rounds"] if options.warmup_rounds else []
    return ", ".join(parts + ([f"cycle from round {options.schedule_start}"] if options.schedule_start else []))


def plan_document(plan: HppPlan) -> dict:
    """The plan as a checkpoint records it (how long planning took is not part of a plan's identity)."""
    return plan.model_dump(mode="json", exclude={"planning_time_s"})


def plan_digest(plan: HppPlan) -> str:
    text = json.dumps(plan_document(plan), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]
