"""PURE: Galaxy's planning for collaborative transformer inference (paper §III-C, Algorithm 1).

The cost model and the strategy registry live in the leaf `hppctl/planner/inference_costs.py`:
`InferenceCosts` turns an `InferenceProfile` into per-device latency functions at the request's
sequence length, L(MHA, a, d), L(MLP, b, d), L(CON, s, d) (Eq. 4), the capacities V_d (Eq. 6), the
memory of a share (Eq. 5's left side) and a communication model of the ring collectives. The
strategies (`hppctl/planner/strategies/{galaxy,megatron,sp,local}.py`) map it to a `Layout`;
`make_inference_plan` turns the layout into an `InferencePlan` with its predicted latency.

Readings of what the paper leaves open (docs/galaxy.md lists them):
- shares are rounded to whole heads and columns by largest remainder, keeping their sums;
- the overflow of a device is the fewest whole units that bring it strictly under its budget,
  capped at its share of the block (the rest is left to the MHA pass);
- the device list L is reset between the MLP and the MHA pass (a device that shed all its MLP
  columns may still need to shed heads), and within a pass a relieved device never receives work;
- sequence rows are split as equally as whole rows allow (the first s mod D devices get one more).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

from hppctl.errors import BadInput, Infeasible
from hppctl.models.inference import (DeviceShare, InferenceMemoryViolation, InferencePlan, InferencePrediction,
                                     InferenceProfile)
from hppctl.models.units import format_bytes
from hppctl.planner.inference_costs import (INFERENCE_STRATEGIES, SYNC, GalaxyExecution, InferenceCosts, Layout,
                                            choose_galaxy_execution, galaxy_or_megatron, layer_latency)
from hppctl.planner.inference_costs import largest_remainder, split_rows  # noqa: F401  (importable from here)


def _load_strategies() -> None:
    """Register the inference strategies on first use (not at import: `split_rows` users such as the
    inference launcher need none of them)."""
    from hppctl.planner.strategies import galaxy, local, megatron, sp  # noqa: F401  (they register)


def make_inference_plan(profile: InferenceProfile, strategy: str, seq_len: int | None = None) -> InferencePlan:
    """Plan `strategy` at `seq_len` (default: the profile's only length). Infeasible when no layout fits."""
    _load_strategies()
    if strategy not in INFERENCE_STRATEGIES:
        raise BadInput(f"--strategy: unknown inference strategy {strategy!r} "
                       f"(known: {', '.join(INFERENCE_STRATEGIES)})")
    costs = InferenceCosts(profile, resolve_seq_len(profile, seq_len))
    started = time.perf_counter()
    layout = INFERENCE_STRATEGIES[strategy](costs)
    elapsed = time.perf_counter() - started
    if layout is None:
        raise Infeasible(explain_infeasible(costs))
    return to_inference_plan(costs, strategy, layout, elapsed)


def resolve_seq_len(profile: InferenceProfile, seq_len: int | None) -> int:
    if seq_len is not None:
        if seq_len <= 0:
            raise BadInput(f"--seq-len: must be a positive number of tokens (got {seq_len})")
        return seq_len
    lengths = sorted({t.seq_len for d in profile.devices for t in d.timings})
    if len(lengths) != 1:
        raise BadInput(f"--seq-len: required, the profile holds several lengths ({', '.join(map(str, lengths))})")
    return lengths[0]


def to_inference_plan(costs: InferenceCosts, strategy: str, layout: Layout, elapsed: float) -> InferencePlan:
    p = costs.profile
    L = p.num_layers
    execution, own_latency_s = GalaxyExecution(), None
    if strategy == "galaxy":
        own_execution, own_latency = choose_galaxy_execution(costs, layout)
        execution, chosen, latency = galaxy_or_megatron(costs, own_execution, layout, own_latency)
        if (execution, chosen) != (own_execution, layout):
            own_latency_s = L * own_latency.total_s
        layout = chosen
        if execution.collective == "all-reduce":
            layout = every_row_everywhere(costs, layout)
    else:
        latency = layer_latency(costs, strategy, layout)
    shares = []
    for d, a, b, r in zip(layout.devices, layout.heads, layout.columns, layout.rows):
        shares.append(DeviceShare(device=costs.names[d], heads=a, columns=b, rows=r, capacity=costs.capacity(d),
                                  memory_bytes=costs.memory(a, b), memory_budget_bytes=costs.budget[d]))
    violations = [InferenceMemoryViolation(device=s.device, needed_bytes=s.memory_bytes,
                                           budget_bytes=s.memory_budget_bytes)
                  for s in shares if s.memory_bytes >= s.memory_budget_bytes]
    return InferencePlan(
        strategy=strategy, model=p.model, family=p.family, profile_digest=p.digest(), seq_len=costs.seq_len,
        num_layers=L, hidden=p.hidden, heads=p.heads, intermediate=p.intermediate,
        sync="all-reduce" if execution.collective == "all-reduce" else SYNC[strategy],
        overlap=any(execution.block_overlap), shares=shares,
        block_overlap=list(execution.block_overlap) if strategy == "galaxy" else None,
        collective=execution.collective,
        prediction=InferencePrediction(latency_s=L * latency.total_s, compute_s=L * latency.compute_s,
                                       communication_s=L * latency.communication_s,
                                       exposed_communication_s=L * latency.exposed_s),
        own_latency_s=own_latency_s, memory_violations=violations, planning_time_s=elapsed)


def every_row_everywhere(costs: InferenceCosts, layout: Layout) -> Layout:
    """`layout` with the connective blocks on the whole sequence on every device: what Megatron's forward
    (galaxy's AllReduce path) runs, and how a megatron plan lists it. The plan listed the ring's row
    split there (95/95/94 for BERT-L in B against megatron's 284 each), which no device ran."""
    return dataclasses.replace(layout, rows=(costs.seq_len,) * len(layout.devices))


def explain_infeasible(costs: InferenceCosts) -> str:
    p = costs.profile
    whole = costs.memory(p.heads, p.intermediate)
    total_budget = sum(costs.budget)
    return (f"no inference plan fits the memory budgets: {p.model} ({p.num_layers} layers) needs "
            f"{format_bytes(whole)} of layer weights, the {costs.D} device(s) hold "
            f"{format_bytes(total_budget)} together ({', '.join(f'{n} {format_bytes(b)}' for n, b in zip(costs.names, costs.budget))}), "
            f"and whole heads and columns could not be placed under every budget")


def compare_inference(profile: InferenceProfile, seq_len: int | None = None) -> list[tuple[str, InferencePlan | None, str]]:
    """Every inference strategy on the same profile: (name, plan or None, note), fastest feasible first."""
    _load_strategies()
    rows = []
    for name in INFERENCE_STRATEGIES:
        try:
            plan = make_inference_plan(profile, name, seq_len)
            rows.append((name, plan, "OOM" if plan.memory_violations else ""))
        except Infeasible as e:
            rows.append((name, None, str(e)))
    return sorted(rows, key=lambda r: (r[1] is None or bool(r[1].memory_violations),
                                       r[1].prediction.latency_s if r[1] else math.inf))


@dataclass(frozen=True)
class DefaultChoice:
    """The strategy `hppctl plan` picks on an inference profile when none is asked for, and why."""

    strategy: str
    reason: str


def choose_inference_strategy(profile: InferenceProfile, seq_len: int | None = None) -> DefaultChoice:
    """The fastest predicted strategy that fits the memory budgets. Galaxy was the default whatever
    the prediction: on Env C's bert-large it is predicted 7.6 s a pass against local's 0.37 s, and
    nothing said so. With nothing that fits, galaxy is planned (its error or OOM report says why)."""
    rows = compare_inference(profile, seq_len)
    fits = [(name, plan) for name, plan, _ in rows if plan is not None and not plan.memory_violations]
    if not fits:
        return DefaultChoice("galaxy", "no inference strategy fits the memory budgets; planning galaxy")
    best, best_plan = fits[0]
    galaxy = next((plan for name, plan, _ in rows if name == "galaxy"), None)
    others = ", ".join(f"{name} {plan.prediction.latency_s:.3f} s" for name, plan in fits if name != best)
    if best == "galaxy":
        return DefaultChoice("galaxy", f"chose galaxy: predicted {best_plan.prediction.latency_s:.3f} s, the fastest"
                                       + (f" (then {others})" if others else ""))
    if galaxy is None or galaxy.memory_violations:
        why = "does not fit the memory budgets"
    else:
        why = f"predicted {galaxy.prediction.latency_s:.3f} s"
    return DefaultChoice(best, f"galaxy {why}, {best} {best_plan.prediction.latency_s:.3f} s: chose {best}, the "
                               f"fastest predicted (--strategy galaxy plans galaxy; --compare shows all)")
