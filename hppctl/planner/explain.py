"""Per-step breakdown of a plan (Eqs. 4–6): what `hppctl plan --explain` shows. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from hppctl.errors import PlanMismatch
from hppctl.models.plan import HppPlan
from hppctl.models.profile import Profile
from hppctl.planner.cost import CostModel, StageChoice, Step, dominant_step


@dataclass(frozen=True)
class StepRow:
    index: int
    kind: str  # "stage" or "transfer"
    label: str
    forward_s: float  # E_f
    backward_s: float  # E_b
    wait_s: float  # T_w
    execute_s: float  # T_e
    allreduce_s: float  # T_a, the part the last backward does not hide (what the round waits for)
    end_s: float  # T_w + T_e + T_a
    memory: tuple[tuple[str, int, int], ...]  # (device, predicted bytes, budget bytes)
    dominant: bool


def check_plan_matches(plan: HppPlan, profile: Profile, source: str = "plan", profile_source: str = "the profile") -> None:
    """Refuse a plan made for another model or another profile, and one whose stages the profile cannot
    describe. The one check `hppctl plan --plan`, `hppctl simulate` and `hppctl run` make: the digest
    is only a claim (anyone can copy it into an edited plan), and a layer range past the model or an
    unknown device was an IndexError, KeyError or ValueError traceback in the cost model."""
    if plan.model != profile.model:
        raise PlanMismatch(f"{source}: model: plan is for {plan.model!r}, profile is for {profile.model!r}")
    if plan.profile_digest != profile.digest():
        raise PlanMismatch(f"{source}: profile_digest: plan was made from profile {plan.profile_digest}, "
                           f"this profile is {profile.digest()}; re-run `hppctl plan` on it")
    if plan.num_layers != len(profile.layers):
        last = len(plan.stages) - 1
        raise PlanMismatch(f"{source}: stages.{last}.layers: the plan covers {plan.num_layers} layers, "
                           f"{profile_source} has {len(profile.layers)}")
    known = {d.name for d in profile.devices}
    for p, stage in enumerate(plan.stages):
        for i, device in enumerate(stage.devices):
            if device not in known:
                raise PlanMismatch(f"{source}: stages.{p}.devices.{i}: device {device!r} is not in {profile_source}")


def layer_span(start: int, end: int) -> str:
    """A half-open range [start, end) as people count layers: first-last, inclusive."""
    if end <= start:
        return "none"
    return str(start) if end - start == 1 else f"{start}-{end - 1}"


def stage_layers(stage) -> str:
    """A stage's layers for people; Bi-Partition's separate backward cut beside them."""
    forward = layer_span(stage.start, stage.end)
    if not stage.backward_layers:
        return forward
    return f"{forward}, backward {layer_span(*stage.backward)}"


def stage_choices(plan: HppPlan, profile: Profile) -> list[StageChoice]:
    index = {d.name: i for i, d in enumerate(profile.devices)}
    return [StageChoice(s.start, s.end, tuple(index[d] for d in s.devices), tuple(s.samples)) for s in plan.stages]


def explain(plan: HppPlan, profile: Profile) -> list[StepRow]:
    if any(s.backward_layers is not None for s in plan.stages):
        # Bi-Partition: Asteroid's evaluation knows one range per stage; the plan's own figures come
        # from Bi-Partition's model (planner/bipartition.py), so the steps are read from the plan.
        steps = []
        for p, stage in enumerate(plan.stages):
            steps.append(Step(stage.forward_s, stage.backward_s, stage.allreduce_s))  # Bi-Partition: one device
            if p < len(plan.transfers):
                steps.append(Step(plan.transfers[p].forward_s, plan.transfers[p].backward_s))
        return step_rows(tuple(steps), plan.num_micro_batches, plan, [s.memory_bytes for s in plan.stages])
    cm = CostModel(profile, micro_batch=plan.micro_batch, num_micro_batches=plan.num_micro_batches)
    stages = stage_choices(plan, profile)
    ev = cm.evaluate(stages, plan.schedule)
    return step_rows(ev.steps, cm.M, plan, ev.memory_bytes)


def step_rows(steps: tuple[Step, ...], m: int, plan: HppPlan, memory) -> list[StepRow]:
    dm = dominant_step(steps, m)
    e_dm = m * (steps[dm].forward_s + steps[dm].backward_s)
    rows, wait = [], 0.0
    for s, step in enumerate(steps):
        if s < dm:  # Eq. (6)
            execute = e_dm + sum(steps[i].forward_s + steps[i].backward_s for i in range(s, dm))
        else:
            execute = e_dm - sum(steps[i].forward_s + steps[i].backward_s for i in range(dm, s))
        if s % 2 == 0:
            stage = plan.stages[s // 2]
            label = f"stage {s // 2}: layers {stage_layers(stage)} on {', '.join(stage.devices)}"
            mem = tuple(zip(stage.devices, memory[s // 2], stage.memory_budget_bytes))
            kind = "stage"
        else:
            label = f"transfer {s // 2} -> {s // 2 + 1}"
            mem, kind = (), "transfer"
        rows.append(StepRow(s, kind, label, step.forward_s, step.backward_s, wait, execute, step.exposed_allreduce_s,
                            wait + execute + step.exposed_allreduce_s, mem, s == dm))
        wait += step.forward_s  # Eq. (5): T_w is the sum of upstream forward times
    return rows
