"""TiMePReSt's version difference v: from simulating the nf1b schedule, and the closed forms. PURE.

v is the number of interleaved update sequences (seeds/003 §4.4): mini-batch k's backward sees the
update of mini-batch k − v. Rule used by the simulation (notes/timeprest.md §5.4, the paper's rule
is stated only through its unavailable figures): a version is complete once its mini-batch's
backward has ended on the head stage; the backward of mini-batch k (1-based) sees the newest
complete version when it starts on the tail, j = the number of mini-batches complete by then, and
v(k) = k − j. The schedule is replayed by the same event-driven simulator as any plan
(`simulate.simulate`) on the paper's unit time-points: a micro-batch forward and a mini-batch
backward take one per stage, transfers none.

Closed forms beside it:
- the paper's (eq. 25): v = ⌊(W + N − 2) / N⌋;
- the notes' steady state: v = 1 + ⌊(W − 1) / (N + 1)⌋ (each stage completes a mini-batch every
  N + 1 time-points and a backward spends W on its way from tail to head).
Both give v = 1 exactly when W ≤ N + 1 (eq. 11), the rule the planner recommends: N ≥ W − 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from hppctl.models.schedule import Schedule, ScheduleStage
from hppctl.schedule.nf1b import build_async
from hppctl.schedule.simulate import simulate


def paper_version_difference(W: int, N: int) -> int:
    """Eq. 25 of seeds/003: v = ⌊(W + N − 2) / N⌋."""
    return (W + N - 2) // N


def steady_version_difference(W: int, N: int) -> int:
    """notes/timeprest.md §5.4: v = 1 + ⌊(W − 1) / (N + 1)⌋."""
    return 1 + (W - 1) // (N + 1)


def recommended_micro_batches(W: int) -> int:
    """Fewest micro-batches per mini-batch with v = 1 (W ≤ N + 1), and at least 2 (eq. 4)."""
    return max(2, W - 1)


class _UnitTimings:
    """The paper's time-points in N-ths for `simulate`: F of a micro-batch N, B of a micro-batch 1
    (a mini-batch's N backwards: N), transfers 0. Integers keep every comparison exact."""

    def __init__(self, N: int) -> None:
        self.N = N

    def compute_s(self, device: str, stage: int, kind: str, samples: int) -> float:
        return float(self.N) if kind == "F" else 1.0

    def message_bytes(self, cut: int, samples: int) -> int:
        return 0

    def transfer_s(self, src: str, dst: str, cut: int, samples: int) -> float:
        return 0.0

    def allreduce_s(self, stage: int) -> float:
        return 0.0

    def allreduce_bytes(self, stage: int) -> int:
        return 0

    def step_s(self, device: str, stage: int) -> float:
        return 0.0

    def activation_bytes_per_sample(self, stage: int) -> int | None:
        return None

    def fixed_bytes(self, stage: int) -> int | None:
        return None

    def budget_bytes(self, device: str) -> int | None:
        return None


@dataclass(frozen=True)
class VersionDifference:
    W: int
    N: int
    simulated: int
    """Largest v(k) over the window (the steady state once the pipeline is full)."""
    per_mini_batch: tuple[int, ...]
    """v(k) of every mini-batch k = 1..K of the simulated window."""
    paper: int
    steady: int
    round_time_points: float
    """Simulated time-points of the whole window (throughput check of the in-flight cap)."""

    def as_json(self) -> dict:
        return {"W": self.W, "N": self.N, "simulated": self.simulated, "paper_formula": self.paper,
                "steady_state_formula": self.steady, "per_mini_batch": list(self.per_mini_batch)}


def unit_schedule(W: int, N: int, K: int, in_flight_cap: int | None = None) -> Schedule:
    """nf1b on W one-device stages `s0 … s{W-1}` with unit time-points (micro-batch of one sample)."""
    stages = [ScheduleStage(layers=[p, p + 1], devices=[f"s{p}"], samples=[1], warmup=1) for p in range(W)]
    return build_async("nf1b", stages, micro_batch=1, micro_batches_per_update=N, num_mini_batches=K,
                       in_flight_cap=in_flight_cap)


def default_window(W: int, N: int) -> int:
    """Mini-batches enough to reach the steady state: the ramp lasts about W / (N + 1) + 2 mini-batches."""
    return 2 * W + 6


def simulated_version_difference(W: int, N: int, *, K: int | None = None,
                                 in_flight_cap: int | None = None) -> VersionDifference:
    """Simulate nf1b on unit time-points and measure v(k) for every mini-batch (rule in the module docstring)."""
    K = K or default_window(W, N)
    schedule = unit_schedule(W, N, K, in_flight_cap)
    result = simulate(schedule, _UnitTimings(N), trace=True)
    head, tail = schedule.stages[0].devices[0], schedule.stages[-1].devices[0]
    tail_start: dict[int, float] = {}
    head_end: dict[int, float] = {}
    for span in result.spans:
        if span.category != "backward":
            continue
        k, j = divmod(span.args["micro_batch"], N)
        if span.track == tail and j == 0:
            tail_start[k] = span.start_s
        if span.track == head and j == N - 1:
            head_end[k] = span.start_s + span.duration_s
    per = tuple(k + 1 - sum(1 for j in range(k) if head_end[j] <= tail_start[k]) for k in range(K))
    return VersionDifference(W, N, max(per), per, paper_version_difference(W, N), steady_version_difference(W, N),
                             result.round_latency_s / N)


EQ11_CHECKED_UP_TO = 16
"""The simulation gives v = 1 exactly when W <= N + 1 for every W, N in 2..16 (tests/timeprest,
docs/timeprest.md); beyond that N, `plan_version_report` takes eq. 11's word for it."""


def plan_version_report(num_stages: int, micro_batches: int) -> dict | None:
    """What `hppctl plan` reports for running a plan under nf1b (mini-batch = the global batch, N =
    its micro-batches): v simulated and by the paper's formula, and the N that gives v = 1.
    None for a single stage (no pipeline, no staleness)."""
    W, N = num_stages, micro_batches
    if W < 2:
        return None
    if N < 2:
        return {"W": W, "N": N, "simulated": None, "paper_formula": None, "steady_state_formula": None,
                "recommended_min_micro_batches": recommended_micro_batches(W),
                "advice": f"nf1b needs N >= 2 micro-batches per mini-batch; N >= {recommended_micro_batches(W)} gives v = 1"}
    if N >= W - 1 and N > EQ11_CHECKED_UP_TO:
        # v = 1 by eq. 11; simulating would replay W x (2W + 6) x N actions (10000 micro-batches: 62 s
        # and 2.8 GB for a line of `hppctl plan` output), so the simulation runs only where eq. 11 was
        # checked against it or where it can give v > 1 (N < W - 1: bounded by the stage count)
        return {"W": W, "N": N, "simulated": None, "paper_formula": paper_version_difference(W, N),
                "steady_state_formula": steady_version_difference(W, N), "per_mini_batch": None,
                "recommended_min_micro_batches": recommended_micro_batches(W),
                "advice": f"v = 1: a single update sequence (N >= W - 1 = {W - 1}; eq. 11, not simulated "
                          f"beyond N = {EQ11_CHECKED_UP_TO})"}
    result = simulated_version_difference(W, N)
    advice = (f"v = 1: a single update sequence (N >= W - 1 = {W - 1})" if result.simulated == 1 else
              f"v = {result.simulated}: {result.simulated} interleaved update sequences; "
              f"use N >= {recommended_micro_batches(W)} micro-batches per mini-batch for v = 1")
    return {**result.as_json(), "recommended_min_micro_batches": recommended_micro_batches(W), "advice": advice}


def describe_version_report(report: dict) -> str:
    """`plan_version_report` in words a practitioner reads without the paper; v and the paper's
    figure stay beside them for those who have it (docs/timeprest.md)."""
    W, N = report["W"], report["N"]
    fewest = report["recommended_min_micro_batches"]
    if report["simulated"] is None and report["paper_formula"] is None:  # N < 2: no mini-batch to split
        return (f"nf1b needs at least 2 micro-batches per mini-batch (this plan has {N}); with {fewest} or more, "
                f"each mini-batch's backward sees every earlier update (version difference v = 1)")
    v = report["simulated"] if report["simulated"] is not None else 1  # None: v = 1 by eq. 11 (N >= W - 1)
    how = "simulated" if report["simulated"] is not None else "by eq. 11"
    figures = f"version difference v = {v} {how}, paper's formula {report['paper_formula']}"
    setting = f"{W} stages, {N} micro-batches per mini-batch"
    if v == 1:
        return f"{setting}: each mini-batch's backward sees every earlier update ({figures})"
    missed = "the update" if v == 2 else f"the updates of the {v - 1} mini-batches"
    return (f"{setting}: each mini-batch's backward misses {missed} before it ({figures}); "
            f"{fewest} or more micro-batches per mini-batch give v = 1")
