"""Asynchronous schedules for pipelines of one device per stage: TiMePReSt's `nf1b` and its
baseline `pipedream` (PipeDream 1F1B with weight stashing). PURE.

Both cover a window of K mini-batches (an epoch) with no flush between mini-batches; every stage
steps its optimizer after each mini-batch's backward (`STEP`), so stages run different weight
versions at the same time. Version u of a stage is its weights after u STEPs; every F and B carries
the version it runs with (`3F1[0:8]@2`):

- a forward runs with the version the head stage had when it injected the micro-batch, on every
  stage (vertical sync), so a stage keeps an old version while forwards tagged with it pass;
- `nf1b` (TiMePReSt, seeds/003 §4.2): a mini-batch is N micro-batches; each stage runs their N
  forwards as they arrive and, once they all reached the tail, one backward of the mini-batch's
  mean loss with the stage's *latest* weights (no horizontal stash; the runtime recomputes the
  stage forward from the stored stage input). That backward is written as the N micro-batch
  backwards back to back (the gradient of a mean is the mean of the gradients at equal weights),
  then STEP. Backward first when both are ready; the head injects a micro-batch whenever it is
  idle and fewer than `in_flight_cap` mini-batches are in flight (the paper has no cap; the notes
  §7.2.5 ask for one to bound memory);
- `pipedream` (seeds/003 §2, PipeDream): no micro-batching (one "micro-batch" = the mini-batch),
  NOAM = P − p forwards in flight at stage p, then strictly one forward one backward; the backward
  runs with the version its forward used (horizontal weight stashing).

The order of each device is decided here (the runtime only interprets it): an event replay on
integer ticks of the policy above with the given durations, then transfers are placed on both
their devices by one global (tick, id) key, as `generate.py` does for synchronous rounds, so the
lists are deadlock-free under blocking send/receive (`check.check_schedule` proves it again).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from hppctl.models.plan import HppPlan
from hppctl.models.schedule import Action, Schedule, ScheduleStage

ASYNC_POLICIES = ("nf1b", "pipedream")

SIMULATED_WINDOW = 16
"""Mini-batches of the window `hppctl simulate --policy nf1b|pipedream` replays (ramp and drain included)."""

_TICKS = 1_000_000
"""Resolution of the ordering replay: the longest duration becomes this many integer ticks."""


@dataclass(frozen=True)
class AsyncDurations:
    """Seconds per stage for one micro-batch forward and one micro-batch backward, per cut for one
    micro-batch transfer (one way). Only used to decide the order; any positive numbers are valid."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    transfer_s: tuple[float, ...]

    @classmethod
    def unit(cls, num_stages: int, micro_batches_per_update: int) -> "AsyncDurations":
        """The paper's time-points, in N-ths: a micro-batch forward and a whole mini-batch backward
        take one time-point, N each (integers, so that the replay has no rounding)."""
        N = micro_batches_per_update
        return cls((float(N),) * num_stages, (1.0,) * num_stages, (0.0,) * (num_stages - 1))

    @classmethod
    def of_plan(cls, plan: HppPlan) -> "AsyncDurations":
        return cls(tuple(s.forward_s for s in plan.stages), tuple(s.backward_s for s in plan.stages),
                   tuple(t.forward_s for t in plan.transfers))

    def scaled(self, factor: float) -> "AsyncDurations":
        """Durations of a micro-batch `factor` times as large (pipedream's mini-batch = N micro-batches)."""
        return AsyncDurations(*(tuple(x * factor for x in xs) for xs in (self.forward_s, self.backward_s, self.transfer_s)))


def default_in_flight_cap(num_stages: int, micro_batches_per_update: int) -> int:
    """min(W, ⌈2W/N⌉ + 1) mini-batches in flight: the fewest that keep a window of nf1b as fast as
    with no cap, found by simulation on unit time-points for every W, N in 2..12 (tests keep it so);
    PipeDream's NOAM (W) bounds it."""
    W, N = num_stages, micro_batches_per_update
    return min(W, math.ceil(2 * W / N) + 1)


# --- compute orders -----------------------------------------------------------------------------

Item = tuple[str, int]
"""("F", micro-batch), ("B", micro-batch) or ("STEP", mini-batch)."""


def nf1b_orders(num_stages: int, N: int, K: int, cap: int, ticks: "_Ticks") -> list[list[Item]]:
    """The nF1B worker loop (notes §7.1) replayed in events: backward first, head injects when idle."""
    P = num_stages
    free = [0] * P
    act = [dict() for _ in range(P)]    # stage -> micro-batch -> tick its input arrives
    grad = [dict() for _ in range(P)]   # stage -> mini-batch -> [gradients arrived, tick of the last]
    next_f, next_b = [0] * P, [0] * P   # next micro-batch to forward, next mini-batch to backward
    head_open = 0                        # mini-batches the head started and has not stepped
    orders: list[list[Item]] = [[] for _ in range(P)]

    def backward_ready(p: int) -> int | None:
        k = next_b[p]
        if k >= K:
            return None
        arrived = grad[p].get(k)
        return arrived[1] if arrived is not None and arrived[0] == N else None

    def forward_ready(p: int) -> int | None:
        m = next_f[p]
        if m >= K * N:
            return None
        if p == 0:
            return free[0] if (m % N or head_open < cap) else None
        return act[p].get(m)

    while any(next_b[p] < K for p in range(P)):
        best = None
        for p in range(P):
            tb, tf = backward_ready(p), forward_ready(p)
            known = [t for t in (tb, tf) if t is not None]
            if not known:
                continue
            start = max(free[p], min(known))
            kind = "B" if tb is not None and tb <= start else "F"
            if best is None or (start, -p) < (best[0], -best[1]):  # ties: the later stage (backward first)
                best = (start, p, kind)
        assert best is not None, "nf1b replay stuck"  # every stage waits for another: cannot happen
        start, p, kind = best
        if kind == "F":
            m = next_f[p]
            next_f[p] += 1
            head_open += p == 0 and m % N == 0
            free[p] = start + ticks.f[p]
            orders[p].append(("F", m))
            if p < P - 1:
                act[p + 1][m] = free[p] + ticks.t[p]
            else:
                _arrive(grad[p], m // N, free[p])  # the tail's own loss: ready when its forward ends
        else:
            k = next_b[p]
            next_b[p] += 1
            free[p] = start
            for j in range(N):
                free[p] += ticks.b[p]
                orders[p].append(("B", k * N + j))
                if p > 0:
                    _arrive(grad[p - 1], k, free[p] + ticks.t[p - 1])
            orders[p].append(("STEP", k))
            head_open -= p == 0
    return orders


def _arrive(arrivals: dict[int, list[int]], k: int, tick: int) -> None:
    count_last = arrivals.setdefault(k, [0, 0])
    count_last[0] += 1
    count_last[1] = max(count_last[1], tick)


def pipedream_orders(num_stages: int, K: int) -> list[list[Item]]:
    """PipeDream 1F1B: NOAM = P − p forwards at stage p, then one backward one forward (each
    backward followed by its STEP), then the remaining backwards."""
    orders = []
    for p in range(num_stages):
        warm = max(1, min(num_stages - p, K))
        order: list[Item] = [("F", m) for m in range(warm)]
        for m in range(K):
            order += [("B", m), ("STEP", m)]
            if warm + m < K:
                order.append(("F", warm + m))
        orders.append(order)
    return orders


# --- ticks, replay, transfers -------------------------------------------------------------------

@dataclass(frozen=True)
class _Ticks:
    f: tuple[int, ...]
    b: tuple[int, ...]
    t: tuple[int, ...]

    @classmethod
    def of(cls, d: AsyncDurations) -> "_Ticks":
        values = [*d.forward_s, *d.backward_s, *d.transfer_s]
        if all(float(x).is_integer() for x in values) and max(values) <= _TICKS:
            return cls(*(tuple(max(1, int(x)) for x in xs) for xs in (d.forward_s, d.backward_s)), tuple(int(x) for x in d.transfer_s))
        longest = max([*d.forward_s, *d.backward_s, *d.transfer_s, 1e-300])
        tick = longest / _TICKS
        return cls(tuple(max(1, round(x / tick)) for x in d.forward_s), tuple(max(1, round(x / tick)) for x in d.backward_s),
                   tuple(round(x / tick) for x in d.transfer_s))


def _replay(orders: list[list[Item]], ticks: _Ticks) -> tuple[list[list[int]], dict, dict]:
    """Start tick of every item, end tick of every F and B (per stage and micro-batch)."""
    P = len(orders)
    starts: list[list[int]] = [[] for _ in range(P)]
    f_end: dict[tuple[int, int], int] = {}
    b_end: dict[tuple[int, int], int] = {}
    position, clock = [0] * P, [0] * P
    while any(position[p] < len(orders[p]) for p in range(P)):
        progressed = False
        for p in range(P):
            while position[p] < len(orders[p]):
                kind, m = orders[p][position[p]]
                if kind == "F":
                    ready = 0 if p == 0 else f_end.get((p - 1, m))
                    ready = None if ready is None else ready + (ticks.t[p - 1] if p else 0)
                elif kind == "B":
                    ready = f_end.get((p, m)) if p == P - 1 else b_end.get((p + 1, m))
                    ready = None if ready is None else ready + (ticks.t[p] if p < P - 1 else 0)
                else:
                    ready = 0
                if ready is None:
                    break
                begin = max(clock[p], ready)
                starts[p].append(begin)
                clock[p] = begin + {"F": ticks.f[p], "B": ticks.b[p], "STEP": 0}[kind]
                if kind != "STEP":
                    (f_end if kind == "F" else b_end)[(p, m)] = clock[p]
                position[p] += 1
                progressed = True
        assert progressed, "async order cannot complete"
    return starts, f_end, b_end


def _versions(orders: list[list[Item]], policy: str) -> tuple[dict[int, int], list[dict[int, int]]]:
    """Forward version of every micro-batch (the head's STEPs before it) and backward versions per stage."""
    steps, f_version = 0, {}
    for kind, m in orders[0]:
        if kind == "F":
            f_version[m] = steps
        steps += kind == "STEP"
    b_versions = []
    for order in orders:
        steps, mine = 0, {}
        for kind, m in order:
            if kind == "B":
                mine[m] = f_version[m] if policy == "pipedream" else steps
            steps += kind == "STEP"
        b_versions.append(mine)
    return f_version, b_versions


def build_async(policy: str, stages: Sequence[ScheduleStage], *, micro_batch: int, micro_batches_per_update: int,
                num_mini_batches: int, durations: AsyncDurations | None = None, in_flight_cap: int | None = None,
                model: str = "", profile_digest: str = "") -> Schedule:
    """An asynchronous schedule of `num_mini_batches` mini-batches on one-device stages.

    `micro_batch` is the samples of one micro-batch (pipedream: of one mini-batch, with
    `micro_batches_per_update` 1). `durations` are per micro-batch (default: the paper's unit time-points).
    """
    P, N, K = len(stages), micro_batches_per_update, num_mini_batches
    if policy not in ASYNC_POLICIES:
        raise ValueError(f"unknown asynchronous policy {policy!r} (known: {', '.join(ASYNC_POLICIES)})")
    crowded = [p for p, s in enumerate(stages) if len(s.devices) != 1]
    if crowded:
        raise ValueError(f"{policy} needs one device per stage; stage {crowded[0]} has "
                         f"{len(stages[crowded[0]].devices)} ({', '.join(stages[crowded[0]].devices)})")
    if policy == "pipedream" and N != 1:
        raise ValueError(f"pipedream does not micro-batch: micro_batches_per_update must be 1, got {N}")
    ticks = _Ticks.of(durations or AsyncDurations.unit(P, N))
    if policy == "nf1b":
        cap = in_flight_cap or default_in_flight_cap(P, N)
        orders = nf1b_orders(P, N, K, cap, ticks)
    else:
        cap = in_flight_cap or P
        orders = pipedream_orders(P, K)
    starts, f_end, b_end = _replay(orders, ticks)
    f_version, b_versions = _versions(orders, policy)
    warm = [next(i for i, (kind, _) in enumerate(o) if kind == "B") for o in orders]
    stages = [ScheduleStage(layers=list(s.layers), devices=list(s.devices), samples=[micro_batch], warmup=max(1, w))
              for s, w in zip(stages, warm)]
    devices = [s.devices[0] for s in stages]
    actions = {}
    for p, d in enumerate(devices):
        computes = [_compute(kind, p, m, micro_batch, f_version, b_versions[p]) for kind, m in orders[p]]
        actions[d] = _merge(computes, starts[p], _transfers(p, devices, K * N, micro_batch, f_end, b_end))
    return Schedule(policy=policy, model=model, profile_digest=profile_digest, micro_batch=micro_batch,
                    num_micro_batches=K * N, stages=stages, micro_batches_per_update=N, in_flight_cap=cap,
                    actions=actions)


def _compute(kind: str, p: int, m: int, B: int, f_version: dict[int, int], b_version: dict[int, int]) -> Action:
    if kind == "STEP":
        return Action(kind="STEP", stage=p)
    version = f_version[m] if kind == "F" else b_version[m]
    return Action(kind=kind, stage=p, micro_batch=m, start=0, end=B, version=version)


def _transfers(p: int, devices: list[str], M: int, B: int, f_end: dict, b_end: dict) -> list[tuple[tuple, Action]]:
    """This stage's sends and receives, each keyed by the tick its data is produced (same key on both ends)."""
    P, out = len(devices), []
    for m in range(M):
        if p < P - 1:  # cut p: activations out, gradients in
            out.append(((f_end[(p, m)], 0, p, m), Action(kind="SA", stage=p, micro_batch=m, start=0, end=B, peer=devices[p + 1])))
            out.append(((b_end[(p + 1, m)], 1, p, m), Action(kind="RG", stage=p, micro_batch=m, start=0, end=B, peer=devices[p + 1])))
        if p > 0:      # cut p − 1: activations in, gradients out
            out.append(((f_end[(p - 1, m)], 0, p - 1, m), Action(kind="RA", stage=p, micro_batch=m, start=0, end=B, peer=devices[p - 1])))
            out.append(((b_end[(p, m)], 1, p - 1, m), Action(kind="SG", stage=p, micro_batch=m, start=0, end=B, peer=devices[p - 1])))
    return sorted(out, key=lambda item: item[0])


def _merge(computes: list[Action], starts: list[int], comms: list[tuple[tuple, Action]]) -> list[Action]:
    """Comm before compute on equal ticks: a receive lands before the compute that starts when it
    arrives; a send's tick is its producer's end, after that producer's start."""
    out, i = [], 0
    for key, action in comms:
        while i < len(computes) and starts[i] < key[0]:
            out.append(computes[i])
            i += 1
        out.append(action)
    out.extend(computes[i:])
    return out


def async_schedule_for_plan(plan: HppPlan, policy: str, *, num_mini_batches: int, in_flight_cap: int | None = None,
                            unit: bool = False) -> Schedule:
    """The plan's stages under `nf1b` (mini-batch = the plan's global batch, N = its micro-batches)
    or `pipedream` (the same mini-batch, not micro-batched). Durations: the plan's, or unit ones."""
    stages = [ScheduleStage(layers=list(s.layers), devices=list(s.devices), samples=list(s.samples), warmup=1)
              for s in plan.stages]
    N = plan.num_micro_batches
    durations = AsyncDurations.unit(len(stages), N) if unit else AsyncDurations.of_plan(plan)
    if policy == "pipedream":
        return build_async(policy, stages, micro_batch=plan.global_batch, micro_batches_per_update=1,
                           num_mini_batches=num_mini_batches, durations=durations.scaled(N),
                           in_flight_cap=in_flight_cap, model=plan.model, profile_digest=plan.profile_digest)
    return build_async(policy, stages, micro_batch=plan.micro_batch, micro_batches_per_update=N,
                       num_mini_batches=num_mini_batches, durations=durations, in_flight_cap=in_flight_cap,
                       model=plan.model, profile_digest=plan.profile_digest)
