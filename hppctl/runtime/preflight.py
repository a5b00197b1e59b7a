"""Checks made before any worker starts: plan, profile, cluster, model and dataset must agree.

Every failure is `BadInput` (exit 2) naming the file and what disagrees, so a run never gets as far
as starting processes on devices with a plan it cannot execute.
"""

from __future__ import annotations

from hppctl.errors import BadInput, PlanMismatch
from hppctl.models.cluster import ClusterSpec
from hppctl.models.plan import HppPlan
from hppctl.models.profile import Profile


def check_devices(plan: HppPlan, cluster: ClusterSpec, plan_source: str, cluster_source: str) -> None:
    names = {d.name for d in cluster.devices}
    for p, stage in enumerate(plan.stages):
        for d in stage.devices:
            if d not in names:
                raise PlanMismatch(f"{plan_source}: stages.{p}.devices: device {d!r} is not in {cluster_source} "
                                   f"(it lists {', '.join(sorted(names))})")
            spec = cluster.device(d)
            if spec.preset is not None:
                raise PlanMismatch(f"{cluster_source}: device {d!r} is a preset ({spec.preset}), a modelled device "
                                   f"with no machine behind it; `hppctl run` needs `local: true` or `host:` devices")


def check_profile(plan: HppPlan, profile: Profile, plan_source: str, profile_source: str) -> None:
    from hppctl.planner.explain import check_plan_matches

    check_plan_matches(plan, profile, plan_source, f"the profile {profile_source}")


def check_model(plan: HppPlan, plan_source: str) -> None:
    """The model exists, trains, and has the plan's layer count; every stage cut can be executed."""
    from hppctl.zoo import get_model, layer_costs

    spec = get_model(plan.model)
    if spec.task != "train":
        raise PlanMismatch(f"{plan_source}: model {plan.model!r} is an inference model; `hppctl run` trains HPP plans")
    count = len(layer_costs(plan.model, plan.granularity))
    if count != plan.num_layers:
        raise PlanMismatch(f"{plan_source}: the plan covers {plan.num_layers} layers of {plan.model} "
                           f"({plan.granularity}), the model has {count}; re-profile and re-plan")
    _check_cuts(plan, plan_source)


def _check_cuts(plan: HppPlan, plan_source: str) -> None:
    from hppctl.zoo import trace
    from hppctl.zoo.stages import batch_dim, stage_signature

    traced = trace(plan.model, "train")
    for p, stage in enumerate(plan.stages):
        try:
            inputs, outputs = stage_signature(traced, plan.granularity, *_held_layers(stage))
        except BadInput as e:
            raise PlanMismatch(f"{plan_source}: stages.{p}: {e}") from None
        for node in (*inputs, *outputs):
            value = traced.values1[node]
            if batch_dim(traced, node) is None and value.dtype.is_floating_point:
                raise PlanMismatch(f"{plan_source}: stages.{p}: tensor {node.name} crossing the cut has no batch "
                                   f"dimension; the runtime cannot split it by sample")
    _check_one_sample_shares(plan, plan_source, traced)


def _held_layers(stage) -> tuple[int, int]:
    """The layers a stage's devices hold: its forward range, widened by a Bi-Partition backward range."""
    return min(stage.start, stage.backward[0]), max(stage.end, stage.backward[1])


def _check_one_sample_shares(plan: HppPlan, plan_source: str, traced) -> None:
    """A device given 1 sample of each micro-batch normalises each BatchNorm over that sample alone
    (docs/runtime.md, "BatchNorm"); where a BatchNorm sees one value per channel for a sample (a 1x1
    feature map) PyTorch refuses to train it, so the run would fail on that device after start-up."""
    singles = _one_value_batchnorms(traced, plan.granularity)
    for p, stage in enumerate(plan.stages):
        lo, hi = _held_layers(stage)
        blocked = sorted(i for i in singles if lo <= i < hi)
        for device, y in zip(stage.devices, stage.samples):
            if y == 1 and blocked:
                raise PlanMismatch(
                    f"{plan_source}: stages.{p}.samples: {device} gets 1 sample of each micro-batch, and "
                    f"BatchNorm {singles[blocked[0]]} (layer {blocked[0]}) sees one value per channel for one "
                    f"sample, which PyTorch cannot train; plan with a larger --micro-batch")


def _one_value_batchnorms(traced, granularity: str) -> dict[int, str]:
    """Layer index -> the first BatchNorm in it whose input has one value per channel at batch 1."""
    from torch.nn.modules.batchnorm import _BatchNorm

    index = traced.layer_index(granularity)
    found: dict[int, str] = {}
    for node in traced.nodes:
        if node.op != "call_module" or node not in index:
            continue
        module = traced.root.get_submodule(node.target)
        if not isinstance(module, _BatchNorm):
            continue
        value = traced.values1.get(node.args[0])
        if value is not None and value.dim() >= 2 and value.numel() == value.shape[1]:
            found.setdefault(index[node], node.target)
    return found


def check_schedule(plan: HppPlan, plan_source: str) -> None:
    from hppctl.schedule import ScheduleError, check_schedule, schedule_for_plan

    try:
        check_schedule(schedule_for_plan(plan))
    except (ScheduleError, ValueError) as e:
        raise PlanMismatch(f"{plan_source}: its schedule is invalid: {e}") from None


def check_data(plan: HppPlan, dataset: str):
    """Load the dataset as the workers will; it must hold at least one global batch."""
    from hppctl.runtime.data import load_data

    data = load_data(dataset, plan.model)
    if len(data.train) < plan.global_batch:
        raise BadInput(f"--dataset {dataset}: {len(data.train)} training samples, fewer than the plan's global "
                       f"batch {plan.global_batch}")
    return data


def preflight(plan: HppPlan, cluster: ClusterSpec, dataset: str, *, profile: Profile | None = None,
              plan_source: str = "plan", cluster_source: str = "cluster", profile_source: str = "profile"):
    """All checks, cheapest first; returns the loaded dataset."""
    check_devices(plan, cluster, plan_source, cluster_source)
    if profile is not None:
        check_profile(plan, profile, plan_source, profile_source)
    check_schedule(plan, plan_source)
    check_model(plan, plan_source)
    return check_data(plan, dataset)
