"""How far can any training plan go on a profile? Issue 28's "asteroid >= 1.5x the best real peer", bounded.

    python bench/pipeline_headroom.py --profile /work/runs/envb-profile-auto-quiet.json
    python bench/pipeline_headroom.py --profile P --split-backward   # also measure the weight-gradient share

Per micro-batch B (divisors of the global batch within the profile's grid), three figures in samples/s:

- **compute bound**: no plan of any shape or schedule (replicated or not, flushed or zero-bubble or
  interleaved), with free communication and no idle time at all, trains faster on this profile at B.
  It is the linear program "spread every layer's forward + backward of G samples over the devices,
  a device's share of a layer costing its cheapest per-sample time at any batch <= B" (a device never
  runs more than B samples of a micro-batch), minimise the busiest device's time. A relaxation of every
  plan (fractional samples, no dependences, no transfers, no AllReduce, no optimizer step): a true
  upper bound under the profile's times.
- **asteroid** and **pp** (the best one-device-per-stage pipeline hppctl knows, whose split and micro-batch
  the real torch pipelines run in bench/peers.py): the planner's plan at B replayed by the simulator
  (`hppctl plan --compare` at that B).

`--links B,...` adds, at those micro-batches, the compute bound with each host's uplink (`link_bound`):
a mixed-integer program, so it prints the best plan HiGHS found within `--node-limit` nodes and the
bound it proved — whether the 100 Mbit/s links, rather than the flush's idle, cap the plans.

`--split-backward` times, on this machine with one thread, each stage of asteroid's plan at its best B:
the fused backward against the input-gradient-only backward (`torch.autograd.grad` on the stage's
inputs: autograd then skips every weight gradient). The difference bounds the weight-gradient work W a
zero-bubble schedule (split backward, W deferred into the pipeline's bubbles) could move: the idle it
can fill on a stage is at most its W work. Stage 0 has no input gradient and is left out.

A bench, not a test: it asserts nothing and prints the commands' figures for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hppctl.errors import Infeasible  # noqa: E402
from hppctl.models.plan import PlanRequest  # noqa: E402
from hppctl.models.profile import Profile  # noqa: E402
from hppctl.planner import make_plan  # noqa: E402
from hppctl.planner.micro_batch import candidate_micro_batches  # noqa: E402
from hppctl.schedule import simulate_plan  # noqa: E402
from hppctl.store import load  # noqa: E402


def per_sample_costs(profile: Profile, micro_batch: int) -> np.ndarray:
    """(layers, devices): each layer's cheapest forward + backward seconds per sample at any measured
    batch <= micro_batch on each device (inf where the device was measured at no such batch)."""
    costs = np.full((len(profile.layers), len(profile.devices)), np.inf)
    for d, device in enumerate(profile.devices):
        times = np.asarray(device.forward_s) + np.asarray(device.backward_s)  # (layers, batch sizes)
        sizes = np.asarray(device.batch_sizes, dtype=float)
        usable = sizes <= micro_batch
        if usable.any():
            costs[:, d] = (times[:, usable] / sizes[usable]).min(axis=1)
    return costs


def compute_bound(costs: np.ndarray, global_batch: int) -> float | None:
    """Samples/s of the LP relaxation: min T, sum_d x[l, d] = 1 per layer, sum_l x[l, d] c[l, d] G <= T."""
    from scipy.optimize import linprog

    layers, devices = costs.shape
    finite = np.isfinite(costs)
    if not finite.any(axis=1).all():
        return None  # B is below every device's smallest measured batch: the profile says nothing here
    n = layers * devices + 1
    objective = np.zeros(n)
    objective[-1] = 1.0
    each_layer_once = np.zeros((layers, n))
    for layer in range(layers):
        each_layer_once[layer, layer * devices:(layer + 1) * devices] = 1.0
    busiest = np.zeros((devices, n))
    for d in range(devices):
        busiest[d, d:layers * devices:devices] = np.where(finite[:, d], costs[:, d] * global_batch, 0.0)
        busiest[d, -1] = -1.0
    bounds = [(0.0, None if finite[layer, d] else 0.0) for layer in range(layers) for d in range(devices)]
    result = linprog(objective, A_ub=busiest, b_ub=np.zeros(devices), A_eq=each_layer_once, b_eq=np.ones(layers),
                     bounds=bounds + [(0.0, None)], method="highs")
    if result.status != 0:
        raise RuntimeError(f"the bound's linear program did not solve: {result.message}")
    return global_batch / result.fun


def uplinks(profile: Profile) -> list[float]:
    """Each device's fastest link out, bytes/s: its sends go one after another at no more than that
    (the simulator's model; the lab shapes each host's egress as one class)."""
    names = [d.name for d in profile.devices]
    return [max(profile.bandwidth_between(a, b) for b in names if b != a) for a in names]


SHARE, HOLDS, WHOLE, MOVED, STARTS = range(5)
"""The link bound's variables per (layer, device), one block each: x, the device's share of the layer's
samples; y, it holds the layer (binary); w, it runs all of it (binary: no AllReduce); u, |x[l] - x[l+1]|,
the share whose activation crosses the cut after l; s, its range of layers starts at l. Then T."""


class _Program:
    """The link bound's mixed-integer program, built one sparse row at a time."""

    def __init__(self, layers: int, devices: int):
        self.layers, self.devices, self.block = layers, devices, layers * devices
        self.time = 5 * self.block
        self.count = self.time + 1
        self.rows, self.cols, self.vals, self.lower, self.upper = [], [], [], [], []

    def at(self, block: int, layer: int, device: int) -> int:
        return block * self.block + layer * self.devices + device

    def add(self, terms: dict[int, float], lo: float, hi: float) -> None:
        """One constraint lo <= sum(coefficient * column) <= hi."""
        row = len(self.lower)
        for column, value in terms.items():
            self.rows.append(row)
            self.cols.append(column)
            self.vals.append(value)
        self.lower.append(lo)
        self.upper.append(hi)

    def matrix(self):
        from scipy.sparse import coo_matrix

        return coo_matrix((self.vals, (self.rows, self.cols)), shape=(len(self.lower), self.count)).tocsr()


def _layout_rows(prog: _Program, d: int) -> None:
    """Device d runs one contiguous range of layers it holds, on one share of the samples throughout."""
    x, y = (lambda layer: prog.at(SHARE, layer, d)), (lambda layer: prog.at(HOLDS, layer, d))
    for layer in range(prog.layers):
        prog.add({x(layer): 1.0, y(layer): -1.0}, -np.inf, 0.0)  # runs only what it holds
        prog.add({prog.at(WHOLE, layer, d): 1.0, x(layer): -1.0}, -np.inf, 0.0)  # alone only if all of it
        before = {y(layer - 1): 1.0} if layer else {}
        prog.add({prog.at(STARTS, layer, d): 1.0, y(layer): -1.0, **before}, 0.0, np.inf)
        if layer + 1 < prog.layers:
            moved = prog.at(MOVED, layer, d)
            prog.add({moved: 1.0, x(layer): -1.0, x(layer + 1): 1.0}, 0.0, np.inf)
            prog.add({moved: 1.0, x(layer): 1.0, x(layer + 1): -1.0}, 0.0, np.inf)
            for sign in (1.0, -1.0):  # one share over the whole range: |x[l] - x[l+1]| <= 2 - y[l] - y[l+1]
                prog.add({x(layer): sign, x(layer + 1): -sign, y(layer): 1.0, y(layer + 1): 1.0}, -np.inf, 2.0)
    prog.add({prog.at(STARTS, layer, d): 1.0 for layer in range(prog.layers)}, -np.inf, 1.0)  # one range


def _time_rows(prog: _Program, d: int, costs: np.ndarray, global_batch: int,
               sent_s: tuple[np.ndarray, np.ndarray]) -> None:
    """Device d's compute, and the seconds its uplink sends, each fit in T."""
    compute = {prog.at(SHARE, layer, d): costs[layer, d] * global_batch
               for layer in range(prog.layers) if np.isfinite(costs[layer, d])}
    prog.add({**compute, prog.time: -1.0}, -np.inf, 0.0)
    per_cut, per_layer = sent_s
    sent = {prog.at(MOVED, layer, d): per_cut[layer] for layer in range(prog.layers - 1)}
    for layer in range(prog.layers):
        sent[prog.at(HOLDS, layer, d)] = per_layer[layer]
        sent[prog.at(WHOLE, layer, d)] = -per_layer[layer]
    prog.add({**sent, prog.time: -1.0}, -np.inf, 0.0)


def link_bound(profile: Profile, costs: np.ndarray, global_batch: int, node_limit: int):
    """(a plan the links allow, an upper bound), samples/s: the compute bound with each host's uplink.

    A mixed-integer program over plans in which every device runs one contiguous range of layers on
    one fixed share of the samples (x, every plan dp, pp, asteroid and the torch peers make; ranges
    need not line up into stages), minimising T: each device's compute (as in the compute bound) and
    the bytes it sends fit in T at its fastest link's rate (`uplinks`). What it
    sends per round, at least: for every cut, the activations (forward) or their gradients (backward)
    of the samples whose device changes there, G |x[l] - x[l+1]| boundary bytes; for every layer it
    holds but does not run alone, its parameters' bytes once (any gradient reduction makes every
    member send each element at least once). No dependences and no idle: a flush's warm-up and
    cool-down are not in it. HiGHS stops after `node_limit` branch-and-bound nodes (a count, not a
    time, so a rerun prints the same figures on a busy machine); both figures are then still valid
    (the best plan found, and the solver's proven bound)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    layers, devices = costs.shape
    prog = _Program(layers, devices)
    boundary = np.array([layer.boundary_bytes_per_sample for layer in profile.layers], float)
    params = np.array([layer.param_bytes for layer in profile.layers], float)
    for layer in range(layers):
        prog.add({prog.at(SHARE, layer, d): 1.0 for d in range(devices)}, 1.0, 1.0)
    for d, uplink in enumerate(uplinks(profile)):
        _layout_rows(prog, d)
        _time_rows(prog, d, costs, global_batch, (boundary * global_batch / uplink, params / uplink))
    integrality = np.zeros(prog.count)
    integrality[prog.at(HOLDS, 0, 0):prog.at(MOVED, 0, 0)] = 1  # y and w
    high = np.ones(prog.count)
    high[prog.time] = np.inf
    for d in range(devices):
        high[prog.at(MOVED, layers - 1, d)] = 0.0  # no cut after the last layer
        for layer in range(layers):
            if not np.isfinite(costs[layer, d]):
                high[prog.at(SHARE, layer, d)] = 0.0
    objective = np.zeros(prog.count)
    objective[prog.time] = 1.0
    result = milp(objective, constraints=LinearConstraint(prog.matrix(), prog.lower, prog.upper),
                  integrality=integrality, bounds=Bounds(np.zeros(prog.count), high),
                  options={"node_limit": node_limit})
    found = global_batch / result.fun if result.x is not None else None
    proven = getattr(result, "mip_dual_bound", None)
    return found, (global_batch / proven if proven else None)


def simulated(profile: Profile, global_batch: int, micro_batch: int, strategy: str):
    """(plan, simulated samples/s) of `strategy` at B, or (None, None) if it has no plan there."""
    try:
        plan = make_plan(profile, PlanRequest(global_batch=global_batch, micro_batch=micro_batch), strategy)
    except Infeasible as err:  # no plan at this B: the row says so
        print(f"  {strategy} at B = {micro_batch}: no plan ({err})")
        return None, None
    return plan, global_batch / simulate_plan(plan, profile)[1].round_latency_s


def figure(value: float | None) -> str:
    """A table cell: samples/s to one decimal, or "-" where the strategy has no plan."""
    return "-" if value is None else f"{value:.1f}"


def split_backward_shares(plan, repeats: int) -> list[tuple[str, float, float]]:
    """Per stage after the first: (layers, fused backward ms, input-gradient-only backward ms), one thread."""
    import torch

    from hppctl.runtime.stage import Stage

    torch.set_num_threads(1)
    stages = [Stage(plan.model, plan.granularity, s.layers[0], s.layers[1], seed=0) for s in plan.stages]
    values = [torch.randn_like(spec.empty(plan.micro_batch)) if spec.dtype.is_floating_point
              else torch.zeros_like(spec.empty(plan.micro_batch)) for spec in stages[0].inputs]
    rows = []
    with torch.no_grad():
        values = list(stages[0](*values))
    for stage in stages[1:]:
        fused, input_only = [], []
        for _ in range(repeats):
            for kind, out in (("fused", fused), ("input", input_only)):
                inputs = [v.detach().requires_grad_(v.is_floating_point()) for v in values]
                outputs = [o for o in stage(*inputs) if o.requires_grad]
                grads = [torch.ones_like(o) for o in outputs]
                started = time.perf_counter()
                if kind == "fused":
                    torch.autograd.backward(outputs, grads)
                else:
                    torch.autograd.grad(outputs, [i for i in inputs if i.requires_grad], grads)
                out.append(time.perf_counter() - started)
                for p in stage.parameters():
                    p.grad = None
        with torch.no_grad():
            values = list(stage(*values))
        rows.append((f"{stage.start}-{stage.end}", 1000 * float(np.median(fused[2:])),
                     1000 * float(np.median(input_only[2:]))))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", required=True, help="a measured training profile (hppctl profile's output)")
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--split-backward", action="store_true", help="also time fused vs input-only backward")
    parser.add_argument("--repeats", type=int, default=14, help="backward passes per stage and kind (--split-backward)")
    parser.add_argument("--links", default="", metavar="B,B", help="also the link bound at these micro-batches")
    parser.add_argument("--node-limit", type=int, default=500, help="branch-and-bound nodes per link bound (--links)")
    args = parser.parse_args()
    profile = load(args.profile, Profile)
    sizes = candidate_micro_batches(profile, args.global_batch)
    print(f"{profile.model} ({profile.granularity}) on {profile.cluster}: {len(profile.devices)} devices, "
          f"global batch {args.global_batch}; samples/s")
    print(f"{'B':>5} {'compute bound':>14} {'asteroid sim':>13} {'pp sim':>8}")
    results = {}
    for b in sizes:
        if args.global_batch // b > 256:
            continue  # more than 256 micro-batches per round: no strategy plans these faster
        bound = compute_bound(per_sample_costs(profile, b), args.global_batch)
        if bound is None:
            continue
        ast_plan, ast = simulated(profile, args.global_batch, b, "asteroid")
        _, pp = simulated(profile, args.global_batch, b, "pp")
        results[b] = (bound, ast_plan, ast, pp)
        print(f"{b:>5} {bound:>14.1f} {figure(ast):>13} {figure(pp):>8}")
    best_pp = max((r[3] for r in results.values() if r[3] is not None), default=None)
    best_ast_b = max((b for b in results if results[b][2] is not None), key=lambda b: results[b][2], default=None)
    if best_pp is None or best_ast_b is None:
        return
    target = 1.5 * best_pp
    print(f"best pp (simulated) {best_pp:.1f}; 1.5x that is {target:.1f}; best asteroid (simulated) "
          f"{results[best_ast_b][2]:.1f} at B = {best_ast_b} ({results[best_ast_b][2] / best_pp:.2f}x)")
    below = [b for b, r in results.items() if r[0] < target]
    print(f"micro-batches where no plan of any schedule can reach 1.5x the best pp: {below or 'none'}")
    for b in (int(v) for v in args.links.split(",") if v):
        found, proven = link_bound(profile, per_sample_costs(profile, b), args.global_batch, args.node_limit)
        print(f"links, B = {b}: a no-idle plan within the uplinks reaches {figure(found)}; "
              f"none exceeds {figure(proven)}")
    if args.split_backward:
        plan = results[best_ast_b][1]
        print(f"\nasteroid at B = {best_ast_b}, stages {[tuple(s.layers) for s in plan.stages]}: backward per stage, "
              f"one thread on this machine, median of {args.repeats - 2}")
        for layers, fused, input_only in split_backward_shares(plan, args.repeats):
            print(f"  layers {layers:>8}: fused {fused:6.2f} ms, input gradient only {input_only:6.2f} ms, "
                  f"weight-gradient share at most {1 - input_only / fused:.0%}")


if __name__ == "__main__":
    main()
