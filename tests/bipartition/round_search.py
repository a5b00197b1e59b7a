"""An exhaustive search over Bi-Partition plans scored by what each strategy minimises (the round
estimate the plan reports; the paper's bottleneck for `bipartition-paper`), and the random small
instances it runs on (issue 24 item 1). Shared by tests/bipartition/test_round_optimal.py
and `python bench/bipartition_optimality.py`, which prints the per-strategy table of docs/.

Independent of the DP on purpose: it lists every pair of cut sequences for 1–3 workers, keeps the
valid, interleaved (equal for `layerwise`), memory-feasible ones, and scores each with the planner's
own `round_estimate` (or `evaluate`'s bottleneck) under the model the strategy ranks by, as
tests/planner/test_asteroid.py does for Asteroid with `planner.exhaustive`.
"""

from __future__ import annotations

import itertools
import random

from hppctl.models.plan import HppPlan, PlanRequest
from hppctl.models.profile import Profile
from hppctl.planner import cost_model, run_strategy, to_plan
from hppctl.planner.bipartition import BiCosts, BiOptions, BiResult, costs_from_model, evaluate, interleaved, \
    round_estimate, valid_cuts
from hppctl.planner.cost import CostModel
from tests.conftest import make_profile

INSTANCES = 40
"""Seeded random instances (seeds 0..INSTANCES-1)."""

STRATEGY_OPTIONS = {
    "bipartition": BiOptions(),
    "bipartition-bsa": BiOptions(),
    "bipartition-paper": BiOptions(recompute=False, split_traffic=False),
    "layerwise": BiOptions(equal_cuts=True),
    "bipartition-paper-equal-cuts": BiOptions(recompute=False, split_traffic=False, equal_cuts=True),
}
"""The model each strategy ranks its plans by (strategies/bipartition.py); the plan's prediction is
always the runtime's model, `BiOptions()`, which equals the first, second and fourth. The last is
`bipartition-paper`'s equal-cut candidate."""

PAPER_OBJECTIVE = {"bipartition-paper", "bipartition-paper-equal-cuts"}
"""Strategies minimising the paper's objective, the per-micro-batch bottleneck T(U) (Eq. 3), for each
worker set, over all interleaved cuts and over equal cuts (then keeping the shorter round estimate of
the two, and the worker set by round estimate): compared with the exhaustive minimum bottleneck of
the same kind of cuts on the worker count of their plan."""

GAP_BOUNDS = {"bipartition": 0.0, "bipartition-paper": 0.0, "layerwise": 0.0, "bipartition-bsa": 0.30}
"""Largest round-estimate gap above the exhaustive optimum each strategy is allowed on the instances
(docs/bipartition.md; the binary search's figure is measured, not a guarantee: its worst over
seeds 0..299 of `python bench/bipartition_optimality.py --instances 300`)."""

MAY_MISS = {"bipartition-bsa"}
"""Heuristics allowed to find no plan where one fits (the binary search's crossing neighbours can
both be over the memory budget, and the equal-cut fallback may not fit either)."""


def compare(seed: int, strategy: str) -> tuple[float | None, float | None]:
    """(the strategy's objective, the exhaustive optimum) on instance `seed`; None: no plan. With
    the paper's objective the optimum is over the plan's worker count (see PAPER_OBJECTIVE)."""
    profile, request = instance(seed)
    found = strategy_score(profile, request, strategy)
    cm = cost_model(profile, request)
    if found is None or strategy not in PAPER_OBJECTIVE:
        return found, brute_force(cm, strategy)
    plan = strategy_plan(profile, request, strategy)
    forward, backward = plan_cuts(plan)
    space = strategy if forward != backward else "bipartition-paper-equal-cuts"
    return found, brute_force(cm, space, [len(plan.stages)])


def paper_round_gap(seed: int) -> float | None:
    """How much longer the `bipartition-paper` plan's round estimate (paper's model) is than the least
    round estimate over the same space and every worker count: the price of its objective."""
    profile, request = instance(seed)
    plan = strategy_plan(profile, request, "bipartition-paper")
    if plan is None:
        return None
    cm = cost_model(profile, request)
    workers = [cm.names.index(s.devices[0]) for s in plan.stages]
    ranked = costs_from_model(cm, workers, STRATEGY_OPTIONS["bipartition-paper"])
    latency = round_estimate(ranked, evaluate(ranked, *plan_cuts(plan)))[0]
    return latency / brute_force(cm, "bipartition-paper", kind="round") - 1


def instance(seed: int) -> tuple[Profile, PlanRequest]:
    """1–3 identical devices, 4–8 layers, random layer sizes, memory, bandwidth and micro-batch count."""
    rng = random.Random(seed)
    devices = rng.randint(1, 3)
    speed, memory = rng.uniform(0.3, 3), rng.choice([0.05, 0.2, 1.0, 4.0])
    profile = make_profile(layers=rng.randint(4, 8), speeds=[speed] * devices, memory_gb=[memory] * devices,
                           seed=seed, activation_scale=rng.choice([1, 10, 50]), param_scale=rng.choice([1, 20, 100]),
                           bandwidth_bytes_per_s=rng.choice([1.25e6, 12.5e6, 125e6]))
    micro_batch = rng.choice([4, 8, 16])
    return profile, PlanRequest(global_batch=micro_batch * rng.choice([1, 2, 4, 8]), micro_batch=micro_batch)


def cut_sequences(L: int, W: int) -> list[tuple[int, ...]]:
    return [(0, *inner, L) for inner in itertools.combinations_with_replacement(range(L + 1), W - 1)]


def objective(strategy: str) -> str:
    """What `strategy` minimises: "round" (estimate) or, with PAPER_OBJECTIVE, "bottleneck"."""
    return "bottleneck" if strategy in PAPER_OBJECTIVE else "round"


def score(kind: str, ranked: BiCosts, result: BiResult) -> float:
    return result.bottleneck_s if kind == "bottleneck" else round_estimate(ranked, result)[0]


def brute_force(cm: CostModel, strategy: str, counts: list[int] | None = None, kind: str | None = None) -> float | None:
    """The least objective (`score`, on the strategy's own model) over every executable plan in the
    strategy's space on the first W devices, W in `counts` (default 1..n; devices are identical, so
    the order does not matter). `kind` overrides the strategy's objective."""
    options, kind = STRATEGY_OPTIONS[strategy], kind or objective(strategy)
    best = None
    for W in counts or range(1, len(cm.names) + 1):
        workers = list(range(W))
        ranked = costs_from_model(cm, workers, options)
        runtime = costs_from_model(cm, workers, BiOptions())
        for forward, backward in itertools.product(cut_sequences(cm.num_layers, W), repeat=2):
            if not valid_cuts(forward, backward, cm.num_layers) or not interleaved(forward, backward):
                continue
            if options.equal_cuts and forward != backward:
                continue
            result = evaluate(ranked, forward, backward)
            if not (result.feasible and evaluate(runtime, forward, backward).feasible):
                continue
            value = score(kind, ranked, result)
            best = value if best is None else min(best, value)
    return best


def plan_cuts(plan: HppPlan) -> tuple[tuple[int, ...], tuple[int, ...]]:
    L = plan.stages[-1].end
    return (tuple(s.start for s in plan.stages) + (L,), tuple(s.backward[0] for s in plan.stages) + (L,))


def strategy_plan(profile: Profile, request: PlanRequest, strategy: str) -> HppPlan | None:
    candidate, cm, elapsed = run_strategy(profile, request, strategy)
    return None if candidate is None else to_plan(cm, profile, request, strategy, candidate, elapsed)


def strategy_score(profile: Profile, request: PlanRequest, strategy: str) -> float | None:
    """The objective (`score`) of the strategy's plan under the model it ranks by (for every strategy
    but `bipartition-paper` the round estimate the plan reports; checked here too)."""
    plan = strategy_plan(profile, request, strategy)
    if plan is None:
        return None
    cm = cost_model(profile, request)
    workers = [cm.names.index(s.devices[0]) for s in plan.stages]
    forward, backward = plan_cuts(plan)
    ranked = costs_from_model(cm, workers, STRATEGY_OPTIONS[strategy])
    result = evaluate(ranked, forward, backward)
    if strategy not in PAPER_OBJECTIVE:
        latency = round_estimate(ranked, result)[0]
        assert abs(latency - plan.prediction.round_latency_s) <= 1e-9 * latency, "the plan reports another round"
    return score(objective(strategy), ranked, result)
