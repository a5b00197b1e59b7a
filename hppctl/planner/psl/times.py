"""The paper's six per-pair times (r, p, l, l′, p′, r′) and memory from a profile. Pure.

For client j with cuts (σ1, σ2), helper i, batch B, and link bandwidth bw_ij (bytes/s):

    r   = fwd_j[0, σ1)  + B·a(σ1) / bw       part-1 forward, upload of the cut activations
    p   = fwd_i[σ1, σ2)                       helper part-2 forward
    l   = B·a(σ2) / bw  + fwd_j[σ2, L)        download, part-3 forward (its last layer is the loss)
    l′  = bwd_j[σ2, L)  + B·a(σ2) / bw        part-3 backward, upload of the gradient
    p′  = bwd_i[σ1, σ2)                       helper part-2 backward
    r′  = B·a(σ1) / bw  + bwd_j[0, σ1)        download of the gradient, part-1 backward

a(σ) is the profile's boundary bytes per sample of the cut after layer σ−1 (a gradient has the
size of its activation). Times at batch B come from the profile's grid exactly as the HPP planner
reads them (`CostModel`). Memory follows Eq. 3 of the HPP planner with one batch in flight:
weights + gradients + optimizer state + the batch's saved activations and received input.
"""

from __future__ import annotations

from hppctl.errors import BadInput, Infeasible
from hppctl.models.profile import Profile
from hppctl.models.psl import PslRequest, PslTimes
from hppctl.models.units import format_bytes
from hppctl.planner.cost import CostModel


def check_request(profile: Profile, request: PslRequest) -> None:
    """Every device is in the profile and every cut is 0 < σ1 < σ2 < L; `BadInput` otherwise."""
    names = {d.name for d in profile.devices}
    for field, group in (("clients", request.clients), ("helpers", request.helpers)):
        for k, name in enumerate(group):
            if name not in names:
                raise BadInput(f"{field}.{k}: device {name!r} is not in the profile (has: {', '.join(sorted(names))})")
    layers = len(profile.layers)
    for k, (s1, s2) in enumerate(request.cuts):
        if not 0 < s1 < s2 < layers:
            raise BadInput(f"cuts.{k}: client {request.clients[k]!r}: cut [{s1}, {s2}] must satisfy "
                           f"0 < σ1 < σ2 < {layers} (the model's layer count at this granularity)")


def pair_times(profile: Profile, request: PslRequest) -> PslTimes:
    """The instance of `request` on `profile`; `Infeasible` if a client cannot hold its parts 1 and 3."""
    check_request(profile, request)
    cost = CostModel(profile, micro_batch=request.batch, num_micro_batches=1)
    index = {name: k for k, name in enumerate(cost.names)}
    B, L = request.batch, cost.num_layers
    rows: dict[str, list[list[float]]] = {k: [] for k in ("r", "p", "l", "lp", "pp", "rp")}
    for helper in request.helpers:
        i = index[helper]
        row: dict[str, list[float]] = {k: [] for k in rows}
        for client, (s1, s2) in zip(request.clients, request.cuts):
            j = index[client]
            up = B * cost.boundary[s1 - 1] / cost.bw[j][i]
            down = B * cost.boundary[s2 - 1] / cost.bw[j][i]
            row["r"].append(cost.forward_time(j, 0, s1, B) + up)
            row["p"].append(cost.forward_time(i, s1, s2, B))
            row["l"].append(down + cost.forward_time(j, s2, L, B))
            row["lp"].append(cost.backward_time(j, s2, L, B) + down)
            row["pp"].append(cost.backward_time(i, s1, s2, B))
            row["rp"].append(up + cost.backward_time(j, 0, s1, B))
        for k in rows:
            rows[k].append(row[k])
    _check_clients_fit(cost, request, index)
    return PslTimes(
        r_s=rows["r"], p_s=rows["p"], l_s=rows["l"], l_prime_s=rows["lp"], p_prime_s=rows["pp"], r_prime_s=rows["rp"],
        demand_bytes=[cost.memory(s1, s2, B, 1) for s1, s2 in request.cuts],
        capacity_bytes=[cost.budget[index[h]] for h in request.helpers],
    )


def _check_clients_fit(cost: CostModel, request: PslRequest, index: dict[str, int]) -> None:
    for k, (client, (s1, s2)) in enumerate(zip(request.clients, request.cuts)):
        need = cost.memory(0, s1, request.batch, 1) + cost.memory(s2, cost.num_layers, request.batch, 1)
        have = cost.budget[index[client]]
        if need > have:
            raise Infeasible(f"clients.{k}: client {client!r} needs {format_bytes(need)} for parts 1 and 3 "
                             f"(cut [{s1}, {s2}], batch {request.batch}), its budget is {format_bytes(have)}")
