"""Checks before any PSL worker starts: plan, cluster, model, cuts and data must agree.

Every failure is `PlanMismatch` / `BadInput` (exit 2) with one line naming the file, the field and
what disagrees, as `hppctl run`'s pre-flight (runtime/preflight.py) does for HPP plans.
"""

from __future__ import annotations

from hppctl.errors import BadInput, PlanMismatch
from hppctl.models.cluster import ClusterSpec
from hppctl.models.psl import PslPlan
from hppctl.runtime.preflight import check_machines, check_part


def check_devices(plan: PslPlan, cluster: ClusterSpec, plan_source: str, cluster_source: str) -> None:
    placed = [(f"{field}.{k}", d) for field, group in (("clients", plan.clients), ("helpers", plan.helpers))
              for k, d in enumerate(group)]
    check_machines(placed, cluster, plan_source, cluster_source, "a run")


def check_model(plan: PslPlan, plan_source: str) -> int:
    """The model trains, every cut lies inside it, and every part can be executed; returns L."""
    from hppctl.zoo import get_model, layer_costs, trace

    spec = get_model(plan.model)
    if spec.task != "train":
        raise PlanMismatch(f"{plan_source}: model {plan.model!r} is an inference model; `hppctl psl run` trains")
    count = len(layer_costs(plan.model, plan.granularity))
    traced = trace(plan.model, "train")
    for k, (client, (s1, s2)) in enumerate(zip(plan.clients, plan.cuts)):
        if not s2 < count:
            raise PlanMismatch(f"{plan_source}: cuts.{k}: client {client!r}: cut [{s1}, {s2}] must satisfy "
                               f"σ2 < {count}, the layer count of {plan.model} ({plan.granularity})")
        for a, b in ((0, s1), (s1, s2), (s2, count)):
            check_part(traced, plan.granularity, (a, b), f"{plan_source}: cuts.{k}", f"cut [{a}, {b})",
                       "choose other cut layers")
    return count


def check_data(plan: PslPlan, dataset: str, shares: list[float] | None):
    """The dataset loads for the model and every client's shard holds at least one batch."""
    from hppctl.runtime.data import load_data
    from hppctl.runtime.psl.data import check_shards

    if shares is not None and len(shares) != len(plan.clients):
        raise BadInput(f"--shares: {len(shares)} values for the plan's {len(plan.clients)} clients")
    data = load_data(dataset, plan.model)
    check_shards(len(data.train), shares or [1.0] * len(plan.clients), plan.batch, plan.clients)
    return data


def preflight(plan: PslPlan, cluster: ClusterSpec, dataset: str, shares: list[float] | None = None, *,
              plan_source: str = "plan", cluster_source: str = "cluster"):
    """All checks, cheapest first; returns the loaded dataset."""
    check_devices(plan, cluster, plan_source, cluster_source)
    check_model(plan, plan_source)
    return check_data(plan, dataset, shares)
