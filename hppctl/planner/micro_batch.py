"""`--micro-batch auto`: the micro-batch as a planning decision (issue 28). Pure, like all of the planner.

Which micro-batch B is best depends on the strategy: a pipeline wants several micro-batches in flight,
data parallelism wants as few as possible (one per round: each device runs one forward and one backward
of its share instead of M small ones). The paper's Table 4 takes each strategy's best B; so does this.

The rule (AUTO_RULE, also stored in every plan it chooses):

- candidates: the divisors B of the global batch with at most MAX_MICRO_BATCHES micro-batches per
  round and B at most the sum of the devices' largest profiled batch sizes (no plan of a larger B can
  keep every device within what it was measured at);
- the strategy plans each candidate through `make_plan`-equivalent public entry points (so it picks up
  whatever the cost model says) with no device given more samples per micro-batch than the largest
  batch the profile measured it at (`CostModel.ceiling`: Algorithm 1 splits a stage's samples under
  that cap as under a memory cap, so a group that would put 129 samples on a device measured up to 128
  gets 128/128 instead of losing the candidate);
- a candidate is skipped when no plan fits the memory budgets and those ceilings (Eq. 3; memory-blind
  strategies' plans with violations count as not fitting), or when its plan still gives some device a
  number of samples per micro-batch outside the batch sizes the profile measured that device at (0 is
  fine: the device idles in that stage; below the grid, or a strategy that cannot split a stage):
  outside, the cost model could only scale times proportionally (optimistic below the grid, where
  per-sample time grows; a guess above it, and a measured profile stops at the largest batch that fits
  the device);
- the winner: the highest predicted throughput, ties to the smaller B (less activation memory per
  micro-batch). "Predicted" is the simulated figure when the caller passes the simulator (`hppctl plan`,
  `demo` and the benches do: it replays the plan's schedule action by action and came within 10 % of the
  lab's measurements, where the planner's closed-form estimate overrates deep pipelines, e.g. asteroid on
  Env B at B = 64: estimate 2194.5, simulated 1759.8 samples/s), else the planner's estimate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from hppctl.errors import BadInput, Infeasible
from hppctl.limits import MAX_MICRO_BATCHES
from hppctl.models.plan import HppPlan, MicroBatchCandidate, MicroBatchChoice, PlanRequest
from hppctl.models.profile import Profile
from hppctl.models.units import format_bytes
from hppctl.planner import CompareRow, STRATEGIES, explain_infeasible, rank_rows, run_strategy, to_plan
from hppctl.planner import forked, progress

AUTO = "auto"
"""The value of `--micro-batch` that asks for this choice."""

def auto_rule(ranked_by: str) -> str:
    """The rule in words, as the plan records it; `ranked_by`: "estimate", "simulated" or "measured"."""
    figure = {"simulated": "the simulated throughput (the schedule replayed on the profile)",
              "measured": ("the throughput measured on the cluster (the best simulated candidates, each trained "
                           "for a few rounds: the median samples/s after the warm-up)")}.get(
        ranked_by, "the planner's estimated throughput")
    return (f"divisors of the global batch (at most {MAX_MICRO_BATCHES} micro-batches per round), each planned "
            "with no device given more samples per micro-batch than the profile measured it at; a plan counts "
            "if every device runs a number of samples within the batch sizes the profile measured it at (or "
            f"none) and it fits every memory budget (Eq. 3); the highest {figure} wins, ties to the "
            "smaller micro-batch")


AUTO_RULE = auto_rule("estimate")
"""The rule when no simulator is given (the pure planner alone)."""

Simulate = Callable[[HppPlan], float]
"""A plan's simulated round latency in seconds (`hppctl.schedule.simulated_round_latency(profile)`)."""


@dataclass(frozen=True)
class Tried:
    """One candidate micro-batch: its plan (None if the strategy found none) and why it cannot be chosen."""

    micro_batch: int
    plan: HppPlan | None
    skipped: str | None
    planning_time_s: float
    simulated_round_latency_s: float | None = None
    """The plan replayed by the simulator, when one was given (and the plan can be chosen)."""

    @property
    def throughput(self) -> float | None:
        """The estimate (the planner's formula)."""
        return None if self.skipped is not None else self.plan.prediction.throughput_samples_per_s

    @property
    def simulated_throughput(self) -> float | None:
        sim = self.simulated_round_latency_s
        if self.skipped is not None or sim is None:
            return None
        return self.plan.global_batch / sim if sim > 0 else 0.0

    @property
    def score(self) -> float | None:
        """What ranks the candidates: the simulated throughput if there is one, else the estimate."""
        return self.simulated_throughput if self.simulated_round_latency_s is not None else self.throughput


def divisors(n: int) -> list[int]:
    """Every divisor of n, ascending (O(sqrt n))."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def largest_profiled_batch(profile: Profile) -> dict[str, int]:
    """Per device, the largest batch size the profile measured it at."""
    return {d.name: max(d.batch_sizes) for d in profile.devices}


def profiled_range(profile: Profile) -> dict[str, tuple[int, int]]:
    """Per device, the smallest and the largest batch size the profile measured it at."""
    return {d.name: (min(d.batch_sizes), max(d.batch_sizes)) for d in profile.devices}


def candidate_micro_batches(profile: Profile, global_batch: int) -> list[int]:
    """The micro-batches `auto` tries for `global_batch` on `profile`, ascending."""
    ceiling = sum(largest_profiled_batch(profile).values())
    return [b for b in divisors(global_batch) if global_batch // b <= MAX_MICRO_BATCHES and b <= ceiling]


def outside_profile(plan: HppPlan, measured: dict[str, tuple[int, int]]) -> str | None:
    """Why `plan` is not covered by the profile (a device runs a number of samples per micro-batch
    outside the batch sizes it was measured at; none at all is fine), or None."""
    for p, stage in enumerate(plan.stages):
        for device, y in zip(stage.devices, stage.samples):
            low, high = measured[device]
            if y > high:
                return (f"beyond the profile: {device} would run {y} samples per micro-batch (stage {p}), "
                        f"it was profiled up to {high}")
            if 0 < y < low:
                return (f"below the profile: {device} would run {y} samples per micro-batch (stage {p}), "
                        f"it was profiled from {low}")
    return None


def over_memory(plan: HppPlan) -> str | None:
    worst = max(plan.memory_violations, key=lambda v: v.needed_bytes - v.budget_bytes, default=None)
    if worst is None:
        return None
    return (f"does not fit: {worst.device} needs {format_bytes(worst.needed_bytes)} and has "
            f"{format_bytes(worst.budget_bytes)}")


def try_micro_batch(profile: Profile, global_batch: int, micro_batch: int, strategy: str,
                    measured: dict[str, tuple[int, int]], simulate: Simulate | None = None) -> Tried:
    request = PlanRequest(global_batch=global_batch, micro_batch=micro_batch)
    candidate, cm, elapsed = run_strategy(profile, request, strategy, within_profile=True)
    if candidate is None:
        return skipped_within_profile(profile, request, strategy, measured, elapsed)
    plan = to_plan(cm, profile, request, strategy, candidate, elapsed)
    skipped = over_memory(plan) or outside_profile(plan, measured)
    simulated = simulate(plan) if simulate is not None and skipped is None else None
    return Tried(micro_batch, plan, skipped, elapsed, simulated)


def skipped_within_profile(profile: Profile, request: PlanRequest, strategy: str,
                           measured: dict[str, tuple[int, int]], elapsed: float) -> Tried:
    """The skipped candidate when no plan stays within the ceilings: planned again without them, to say
    whether memory or the profile's batch sizes ruled it out (the plan then kept for `nothing_fits`)."""
    candidate, cm, more = run_strategy(profile, request, strategy)
    if candidate is None:
        return Tried(request.micro_batch, None, "no plan fits the memory budgets", elapsed + more)
    plan = to_plan(cm, profile, request, strategy, candidate, elapsed + more)
    return Tried(request.micro_batch, plan, over_memory(plan) or outside_profile(plan, measured) or
                 "no plan fits the memory budgets within the profile's batch sizes", elapsed + more)


def try_micro_batches(profile: Profile, global_batch: int, strategy: str,
                      simulate: Simulate | None = None) -> list[Tried]:
    """`strategy` planned at every candidate micro-batch, ascending; BadInput if there is none."""
    if strategy not in STRATEGIES:
        raise BadInput(f"--strategy: unknown strategy {strategy!r} (known: {', '.join(sorted(STRATEGIES))})")
    sizes = auto_sizes(profile, global_batch)
    # every other candidate in a forked child where `hppctl plan` allows it (planner/forked.py)
    return [tried for tried, _ in forked.map_split_if_allowed(
        lambda: _candidate_trier(profile, global_batch, sizes, simulate), [(strategy, b) for b in sizes])]


def auto_sizes(profile: Profile, global_batch: int) -> list[int]:
    """`candidate_micro_batches`, or BadInput naming why there is none."""
    sizes = candidate_micro_batches(profile, global_batch)
    if not sizes:
        measured = profiled_range(profile)
        raise BadInput(f"--micro-batch auto: no divisor of --global-batch {global_batch} gives at most "
                       f"{MAX_MICRO_BATCHES} micro-batches per round within the profile's batch sizes (at most "
                       f"{sum(high for _, high in measured.values())} samples per micro-batch over all its devices)")
    return sizes


def _candidate_trier(profile: Profile, global_batch: int, sizes: list[int], simulate: Simulate | None):
    """(strategy, micro-batch of `sizes`) -> (its `Tried`, seconds spent on it, the simulation included)."""
    measured = profiled_range(profile)

    def try_one(item: tuple[str, int]) -> tuple[Tried, float]:
        strategy, b = item
        started = time.perf_counter()
        with progress.within(f"micro-batch {b} ({sizes.index(b) + 1}/{len(sizes)})"):
            tried = try_micro_batch(profile, global_batch, b, strategy, measured, simulate)
        return tried, time.perf_counter() - started
    return try_one


def ranked(tried: list[Tried]) -> list[Tried]:
    """The candidates that can be chosen, highest predicted throughput first; ties: the smaller B."""
    return sorted((t for t in tried if t.skipped is None), key=lambda t: (-t.score, t.micro_batch))


def best(tried: list[Tried]) -> Tried | None:
    """The first of `ranked`, or None when no candidate can be chosen."""
    return next(iter(ranked(tried)), None)


def choice_record(tried: list[Tried], chosen: Tried, measured: dict[int, float] | None = None) -> MicroBatchChoice:
    """The plan's record of the choice; `measured` (micro-batch -> samples/s on the cluster) when a trial
    ranked the candidates."""
    ranked_by = ("measured" if measured else "simulated" if chosen.simulated_round_latency_s is not None
                 else "estimate")
    measured = measured or {}
    return MicroBatchChoice(rule=auto_rule(ranked_by), ranked_by=ranked_by, chosen=chosen.micro_batch, candidates=[
        MicroBatchCandidate(micro_batch=t.micro_batch, skipped=t.skipped) if t.skipped is not None
        else MicroBatchCandidate(micro_batch=t.micro_batch, throughput_samples_per_s=t.throughput,
                                 simulated_samples_per_s=t.simulated_throughput,
                                 measured_samples_per_s=measured.get(t.micro_batch)) for t in tried])


def with_choice(tried: list[Tried], measured: dict[int, float] | None = None) -> HppPlan | None:
    """The best candidate's plan carrying the record of the choice (planning time: all candidates'),
    or None when no candidate can be chosen. With `measured` (a trial's figures, micro-batch ->
    samples/s), the best measured candidate wins, ties to the smaller micro-batch."""
    chosen = best(tried) if not measured else min(
        (t for t in tried if t.micro_batch in measured), key=lambda t: (-measured[t.micro_batch], t.micro_batch),
        default=None)
    if chosen is None:
        return None
    return chosen.plan.model_copy(update={
        "micro_batch_choice": choice_record(tried, chosen, measured),
        "planning_time_s": sum(t.planning_time_s for t in tried)})


TRIAL_WARMUP = 2
"""Rounds of a trial (`hppctl plan --trial`) left out of its figure: workers start and caches fill (as
bench/peers.py leaves them out)."""


def trial_candidates(tried: list[Tried], top: int) -> list[Tried]:
    """What `hppctl plan --trial` trains on the cluster: the `top` choosable candidates of highest score
    (the simulated figure when there is one), best first, ties to the smaller micro-batch. The
    simulator ranks plans well enough to pick a short list, not always the winner: on the CPU-quota
    lab its first choice changed between profiles of labs of one spec, once to a plan 20 % slower
    (docs/planner.md, "Choosing by trial")."""
    return ranked(tried)[:top]


def make_auto_plan(profile: Profile, global_batch: int, strategy: str, simulate: Simulate | None = None) -> HppPlan:
    """`strategy`'s plan at its best micro-batch (by `simulate`'s figure when given); Infeasible (naming
    the device and bytes missing at the smallest micro-batch tried) when no candidate fits, BadInput when
    there is no candidate at all."""
    tried = try_micro_batches(profile, global_batch, strategy, simulate)
    plan = with_choice(tried)
    if plan is None:
        raise Infeasible(nothing_fits(profile, global_batch, tried))
    return plan


def nothing_fits(profile: Profile, global_batch: int, tried: list[Tried]) -> str:
    """The usual infeasible line about the smallest micro-batch memory ruled out, and what auto tried; or,
    when every candidate left the profile's batch sizes instead, the smallest one's reason."""
    sizes = "/".join(str(t.micro_batch) for t in tried)
    by_memory = [t for t in tried if t.plan is None or t.plan.memory_violations]
    if not by_memory:
        return f"--micro-batch auto tried {sizes}: no plan stays within the profile's batch sizes ({tried[0].skipped})"
    smallest = PlanRequest(global_batch=global_batch, micro_batch=by_memory[0].micro_batch)
    return explain_infeasible(profile, smallest, hint=f"--micro-batch auto tried {sizes}: {by_memory[0].skipped}")


def compare_auto(profile: Profile, global_batch: int, simulate: Simulate | None = None) -> list[CompareRow]:
    """`compare` with each strategy at its own best micro-batch. A memory-blind strategy none of whose
    candidates fits shows its plan at the smallest micro-batch (with its memory violations, as `compare`
    shows it at a given micro-batch); any other strategy without a choosable candidate shows none."""
    sizes = auto_sizes(profile, global_batch)
    items = [(name, b) for name in STRATEGIES for b in sizes]
    # every other (strategy, micro-batch) in a forked child where `hppctl plan` allows it (planner/forked.py)
    results = forked.map_split_if_allowed(lambda: _candidate_trier(profile, global_batch, sizes, simulate), items)
    by_strategy: dict[str, list[tuple[Tried, float]]] = {name: [] for name in STRATEGIES}
    for (name, _), result in zip(items, results):
        by_strategy[name].append(result)
    rows = []
    for name, found in by_strategy.items():
        tried, spent = [t for t, _ in found], sum(s for _, s in found)
        started = time.perf_counter()
        chosen = best(tried)
        plan = with_choice(tried) or next((t.plan for t in tried if t.plan is not None and t.plan.memory_violations),
                                          None)
        # the chosen candidate was replayed while choosing: only a fallback plan still needs the simulator
        simulated = (chosen.simulated_round_latency_s if chosen is not None
                     else simulate(plan) if simulate and plan else None)
        rows.append(CompareRow(name, plan, spent + time.perf_counter() - started, simulated))
    return rank_rows(rows, simulate is not None)
