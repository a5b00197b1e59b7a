"""`bipartition`: separate forward and backward cut points (Bi-Partition, notes/bipartition.md).

Each worker is one device running the forward of one contiguous layer range and the backward of
another (docs/bipartition.md). For every device order we try (fastest first, memory first, the
cluster file's) and every worker count W, a search of `bipartition_dp` finds cuts, and the plan kept
is the one with the shortest round estimate (`round_estimate`) under the strategy's model:

- `bipartition`: the DP over the round estimate itself (`solve_round`) on the cost model the runtime
  executes (split layers recomputed by their backward owner, split traffic and weight send-back on
  the links, memory budgets): the least round estimate over interleaved cuts, per device order;
- `bipartition-bsa`: the same model, the paper's binary search for the backward cut (Alg. 2), which
  minimises the per-micro-batch bottleneck heuristically; its plan and the round-optimal equal-cut
  plan are ranked by round estimate (a heuristic: docs/bipartition.md gives its measured gap);
- `bipartition-paper`: the paper's method on the paper's compute model (no recomputation, split
  traffic free; per-device uplinks): for each worker set the exact DP (`solve`) for the least
  per-micro-batch bottleneck T(U) (Eq. 3) over interleaved cuts, as the paper does for its given
  workers, and the same over equal cuts (its layer-wise baseline); of these two per worker set,
  over every device order and W, the shortest round estimate under that model;
- `layerwise`: `solve_round` with equal cuts, the layer-wise special case (the paper's PipeDream
  baseline without replication: one device per stage, transfers and memory priced).

Above `FINE_LAYERS` layers the search runs on super-layers and single cuts are then moved while the
round estimate drops: exact over the coarse cut positions only. Every plan's prediction uses the
runtime's model, so the four compare fairly with `pp` & co.
"""

from __future__ import annotations

from hppctl.models.plan import HppPlan, PlanRequest, Prediction, StagePlan, TransferPlan
from hppctl.planner.asteroid import memory_order
from hppctl.planner.bipartition import BiCosts, BiOptions, BiResult, coarsen_costs, costs_from_model, evaluate, \
    forward_bytes, refine, round_estimate
from hppctl.planner.bipartition_dp import solve, solve_round
from hppctl.planner.cost import CostModel, StageChoice
from hppctl.planner.registry import Candidate, strategy
from hppctl.planner.strategies.dp import fastest_first

SCHEDULE = "1f1b-asteroid"


def device_orders(cm: CostModel) -> list[list[int]]:
    orders: list[list[int]] = []
    for order in (fastest_first(cm), memory_order(cm), list(range(len(cm.names)))):
        if order not in orders:
            orders.append(order)
    return orders


def best_cuts(cm: CostModel, options: BiOptions, search: str = "round") -> tuple[list[int], BiResult] | None:
    """The best (device order prefix, cuts) under `options` (`search` as in `solve_large`; ranked by
    the round estimate under `options`), re-evaluated on the runtime's model (which must fit memory
    too)."""
    best: tuple[float, list[int], BiResult] | None = None
    for order in device_orders(cm):
        for W in range(1, min(len(order), 2 * cm.num_layers) + 1):
            workers = order[:W]
            costs = costs_from_model(cm, workers, options, SCHEDULE)
            candidates = [solve_large(costs, search)]
            if search != "round" or costs.L > FINE_LAYERS:
                # The best equal cuts are a candidate too (by the same objective): the bottleneck
                # searches do not rank by the round, and above FINE_LAYERS the round search is exact
                # over coarse cuts only.
                layer_wise = costs.with_options(BiOptions(options.recompute, options.split_traffic, equal_cuts=True,
                                                          uplink=options.uplink))
                candidates.append(solve_large(layer_wise, "bottleneck" if search == "bottleneck" else "round"))
            for result in candidates:
                if result is None:
                    continue
                runtime = evaluate(costs_from_model(cm, workers, BiOptions(), SCHEDULE), result.forward,
                                   result.backward)
                if not runtime.feasible:
                    continue
                latency, _ = round_estimate(costs, result)  # ranked on the strategy's own model
                if best is None or latency < best[0] * (1 - 1e-12):
                    best = (latency, workers, runtime)
    return None if best is None else (best[1], best[2])


FINE_LAYERS = 32
"""Above this many layers the DP (O(W L^2) states, each an O(L^2) candidate grid) runs on that many
super-layers and the cuts are then polished layer by layer (`refine`)."""


def solve_large(costs: BiCosts, search: str = "round") -> BiResult | None:
    """"round": least round estimate (`solve_round`); "bottleneck": least bottleneck (the exact DP,
    `solve`); "bsa": the paper's binary search on the bottleneck. Above FINE_LAYERS layers, on
    super-layers and then refined on the same objective."""
    if search not in ("round", "bottleneck", "bsa"):
        raise ValueError(f"search must be 'round', 'bottleneck' or 'bsa', got {search!r}")
    if search == "round":
        search_cuts, objective = solve_round, lambda c, result: round_estimate(c, result)[0]
    else:
        exact = "bsa" if search == "bsa" else "exact"
        search_cuts, objective = (lambda c: solve(c, exact)), (lambda c, result: result.bottleneck_s)
    if costs.L <= FINE_LAYERS:
        return search_cuts(costs)
    coarse, cuts = coarsen_costs(costs, FINE_LAYERS)
    result = search_cuts(coarse)
    if result is None:
        return None
    fine = evaluate(costs, [cuts[f] for f in result.forward], [cuts[b] for b in result.backward])
    return refine(costs, fine, objective=objective)


def build_plan(cm: CostModel, workers: list[int], result: BiResult, request: PlanRequest, name: str,
               elapsed: float) -> HppPlan:
    """The HppPlan of one Bi-Partition: one single-device stage per worker, `backward_layers` where
    its backward range differs from its forward range."""
    c = costs_from_model(cm, workers, BiOptions(), SCHEDULE)
    latency, steps = round_estimate(c, result)
    stages = [_stage_plan(cm, c, result, steps, w, d) for w, d in enumerate(workers)]
    transfers = [TransferPlan(after_stage=w, bytes_per_micro_batch=int(_forward_bytes(c, result, w + 1)),
                              forward_s=steps[2 * w + 1].forward_s, backward_s=steps[2 * w + 1].backward_s)
                 for w in range(len(workers) - 1)]
    dominant = max(range(len(steps)), key=lambda s: steps[s].forward_s + steps[s].backward_s)
    return HppPlan(
        strategy=name, model=cm.profile.model, model_input=cm.profile.model_input, granularity=cm.profile.granularity,
        profile_digest=cm.profile_digest, global_batch=request.global_batch, micro_batch=request.micro_batch,
        num_micro_batches=request.num_micro_batches, schedule=SCHEDULE, stages=stages, transfers=transfers,
        prediction=Prediction(
            round_latency_s=latency,
            throughput_samples_per_s=request.global_batch / latency if latency > 0 else 0.0,
            dominant_step=dominant,
            peak_memory_ratio=max(m / c.budget[w] for w, m in enumerate(result.memory_bytes)),
        ),
        planning_time_s=elapsed,
    )


def _stage_plan(cm: CostModel, c: BiCosts, result: BiResult, steps, w: int, device: int) -> StagePlan:
    (i1, j1), (i2, j2) = result.ranges[w]
    return StagePlan(
        layers=[i1, j1], backward_layers=None if (i1, j1) == (i2, j2) else [i2, j2],
        devices=[cm.names[device]], samples=[cm.B], warmup=c.warmup[w],
        forward_s=steps[2 * w].forward_s, backward_s=steps[2 * w].backward_s, allreduce_s=0.0,
        memory_bytes=[int(result.memory_bytes[w])], memory_budget_bytes=[cm.budget[device]],
    )


def _forward_bytes(c: BiCosts, result: BiResult, w: int) -> float:
    """Bytes per micro-batch from worker w-1 to w: activations at the forward cut plus split traffic."""
    return float(forward_bytes(c, result.forward[w], result.backward[w]))


def _candidate(cm: CostModel, options: BiOptions, search: str) -> Candidate | None:
    """The strategy's plan; `search` as in `best_cuts`."""
    found = best_cuts(cm, options, search)
    if found is None:
        return None
    workers, result = found
    stages = [StageChoice(f[0], f[1], (d,), (cm.B,)) for d, (f, _) in zip(workers, result.ranges)]
    return Candidate(stages, schedule=SCHEDULE,
                     build_plan=lambda request, name, elapsed: build_plan(cm, workers, result, request, name, elapsed))


@strategy("bipartition", "Bi-Partition: separate forward/backward cuts, exact DP over the round estimate, split layers "
                         "recomputed and priced")
def plan_bipartition(cm: CostModel) -> Candidate | None:
    return _candidate(cm, BiOptions(), "round")


@strategy("bipartition-bsa", "Bi-Partition with the paper's binary search for the backward cut (Alg. 2; a bottleneck "
                             "heuristic)")
def plan_bipartition_bsa(cm: CostModel) -> Candidate | None:
    return _candidate(cm, BiOptions(), "bsa")


@strategy("bipartition-paper", "Bi-Partition on the paper's cost model (no recomputation, split traffic free) and "
                               "objective (least bottleneck per worker set)")
def plan_bipartition_paper(cm: CostModel) -> Candidate | None:
    # The paper's objective, T(U) (Eq. 3), per worker set; interleaved cuts, so the plan is executable.
    return _candidate(cm, BiOptions(recompute=False, split_traffic=False), "bottleneck")


@strategy("layerwise", "Bi-Partition's round DP with equal cuts: layer-wise stages, transfers and memory priced "
                       "(PipeDream without replication)")
def plan_layerwise(cm: CostModel) -> Candidate | None:
    return _candidate(cm, BiOptions(equal_cuts=True), "round")
