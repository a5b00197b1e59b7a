"""Turn a synchronous plan into its split-backward form (zero-bubble; models/schedule.py, I and W).

The stages, samples and warmups stay the planner's; what changes is how each backward runs: its
input half `I` first, its weight half `W` later, placed by the schedule generator into time the
device would otherwise wait. Each stage records the `W` seconds of its slowest device (the device
whose E_b the plan already carries), from the profile's measured `weight_grad_s`, and how many
micro-batches it may hold at once (`in_flight_cap`): a deferred `W` keeps its micro-batch's
activations and the gradients captured for it (HELD_FOR_W), so the cap is the most that fits
every device of the stage, at least K_p and at most M. More room defers more `W`s into the cool-down, where the idle is.
"""

from __future__ import annotations

from hppctl.errors import Infeasible
from hppctl.models.plan import HppPlan
from hppctl.models.profile import Profile
from hppctl.planner.cost import CostModel


def with_split_backward(plan: HppPlan, profile: Profile, cm: CostModel | None = None) -> HppPlan:
    """The same plan with `split_backward`, every stage's `weight_grad_s`, `in_flight_cap` and memory,
    and the prediction's peak memory ratio (raises ValueError if the profile lacks weight-gradient
    times or the plan cannot split; its round latency stays the estimate's until simulated:
    schedule/split_plan.py). `cm`: the profile's cost model at the plan's micro-batches, if at hand."""
    if any(s.backward_layers is not None for s in plan.stages):
        raise ValueError("Bi-Partition plans (split layers) do not split backwards")
    if cm is None:
        cm = CostModel(profile, micro_batch=plan.micro_batch, num_micro_batches=plan.num_micro_batches)
    cm.check_is_for(profile, plan.micro_batch, plan.num_micro_batches)
    index = {name: i for i, name in enumerate(cm.names)}
    stages = []
    for p, stage in enumerate(plan.stages):
        start, end = stage.layers
        if p == 0:  # no input gradient: the head's whole backward is deferrable
            weight = stage.backward_s
        else:
            weight = max(cm.weight_grad_time(index[d], start, end, y) for d, y in zip(stage.devices, stage.samples) if y)
        cap = in_flight_cap(cm, [index[d] for d in stage.devices], stage.samples, (start, end), stage.warmup)
        memory = [split_memory(cm, (start, end), y, cap) for y in stage.samples]
        short = [(d, m, b) for d, m, b in zip(stage.devices, memory, stage.memory_budget_bytes) if m > b]
        if short:
            d, m, b = short[0]
            raise Infeasible(f"with split backwards {d} (stage {p}) needs {m} bytes for {cap} micro-batches "
                             f"waiting for their weight gradients, its budget is {b}: plan without --split-backward")
        stages.append(stage.model_copy(update={"weight_grad_s": min(weight, stage.backward_s), "in_flight_cap": cap,
                                               "memory_bytes": memory}))
    ratio = max(m / b for s in stages for m, b in zip(s.memory_bytes, s.memory_budget_bytes) if b)
    return plan.model_copy(update={"split_backward": True, "stages": stages,
                                   "prediction": plan.prediction.model_copy(update={"peak_memory_ratio": ratio})})


HELD_FOR_W = 1.6
"""What a micro-batch waiting for its `W` holds, over its Eq. 3 activations: its forward's saved
tensors plus the gradients `I` captured for the weights, measured at 1.20-1.25x on mobilenetv2's
stages and 1.49-1.58x on bert-small's (`python -m tests.runtime.split_backward_timing M B N memory`,
docs/runtime.md); the larger, rounded up, so a raised cap stays within the budget."""


def split_memory(cm: CostModel, layers: tuple[int, int], y: int, in_flight: int) -> int:
    """Eq. 3 of a split stage holding `in_flight` micro-batches of y samples, each as one waiting for its W."""
    start, end = layers
    fixed = cm.fixed_factor * cm.param_bytes(start, end)
    return int(fixed + HELD_FOR_W * in_flight * y * cm.activation_bytes_per_sample(start, end))


def in_flight_cap(cm: CostModel, devices: list[int], samples: list[int], layers: tuple[int, int], warmup: int) -> int:
    """The most micro-batches (K_p..M) a split stage may hold on every device's budget (K_p if no more fit)."""
    best = min(warmup, cm.M)
    for cap in range(best + 1, cm.M + 1):
        if any(split_memory(cm, layers, y, cap) > cm.budget[d] for d, y in zip(devices, samples)):
            break
        best = cap
    return best
