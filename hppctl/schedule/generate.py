"""Schedule generators: per-device action lists for one HPP round.

Compute order per stage (every device of a stage follows it):

- `1f1b-asteroid`: K_p = min(2(P-p)-1, M) forwards, then alternate one backward and one forward
  (Asteroid §3.2, Fig. 4b; P = 3, M = 5 gives K = 5, 3, 1);
- `1f1b`: K_p = min(P-p, M) (PipeDream-Flush / DAPPLE);
- `gpipe`: K_p = M (all forwards, then all backwards);
- any explicit list of K_p (the Fig. 15b ablation uses 2(P-p), 2(P-p)+1).

Split backwards (`split_backward=True`, zero-bubble in the manner of ZB-H1): every `B` of the
order becomes an `I` (input gradients only, what the previous stage waits for), and each
micro-batch's `W` (its weight gradients) is placed by the replay below: a device runs its oldest
pending `W` whenever its next `F` or `I` would otherwise wait for data, and before a forward that
would put more than the stage's `in_flight_cap` micro-batches in memory (a micro-batch holds its
activations until its `W`; the cap defaults to K_p, 1F1B's bound, and the planner raises it as far
as the devices' memory allows: planner/split_backward.py); the rest after its last `I`. The cool-down then runs on `I`s alone, and every stage's input gradients leave a `W`
earlier than a whole backward would let them.

Where the transfers go in each device's list is chosen so that the schedule is deadlock-free even
when every send and receive blocks until its partner arrives (rendezvous): the generator replays
the compute order on integer ticks (from the plan's E_f, E_b and transfer times, or unit costs),
gives every transfer the time its data is produced, and places every transfer on both of its
devices by the same global key (time, transfer id). All devices then meet their transfers and
AllReduces in one global order, and compute never blocks, so the first unfinished transfer in that
order can always complete: no wait-for cycle can form. `check.check_schedule` verifies it anyway.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Callable, Sequence

from hppctl.models.plan import HppPlan
from hppctl.models.schedule import Action, Schedule, ScheduleStage
from hppctl.planner.cost import WARMUP_POLICIES
from hppctl.schedule.bipartition import add_split_actions, is_bipartition
from hppctl.schedule.nf1b import ASYNC_POLICIES, SIMULATED_WINDOW, async_schedule_for_plan
from hppctl.schedule.routing import Route, owned_ranges, routes

POLICIES: dict[str, Callable[[int, int, int], int]] = dict(WARMUP_POLICIES)
"""Named K_p policies `(P, p, M) -> K_p` a plan may carry (`HppPlan.schedule`)."""

ABLATION_POLICIES: dict[str, Callable[[int, int, int], int]] = {
    "2(P-p)": lambda P, p, M: min(2 * (P - p), M),
    "P-p": lambda P, p, M: min(P - p, M),
    "2(P-p)+1": lambda P, p, M: min(2 * (P - p) + 1, M),
    "2(P-p)-1": lambda P, p, M: min(2 * (P - p) - 1, M),
    "gpipe": lambda P, p, M: M,
}
"""Asteroid Fig. 15b: (a) 2(P-p), (b) P-p, (c) 2(P-p)+1, ours 2(P-p)-1, and GPipe."""

_TICKS = 1_000_000
"""Resolution of the ordering replay: the longest duration becomes this many integer ticks."""


@dataclass(frozen=True)
class Durations:
    """Per-stage forward/backward seconds of one micro-batch and per-cut transfer seconds (one way).

    Only used to decide where transfers sit in each list; any positive numbers give a valid schedule.
    """

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    transfer_s: tuple[float, ...]
    weight_s: tuple[float, ...] = ()
    """Split backwards: the part of each stage's backward its `W` takes (empty: half of it)."""

    @classmethod
    def unit(cls, num_stages: int) -> "Durations":
        return cls((1.0,) * num_stages, (2.0,) * num_stages, (0.0,) * max(num_stages - 1, 0))

    @classmethod
    def of_plan(cls, plan: HppPlan) -> "Durations":
        weights = tuple(s.weight_grad_s or 0.0 for s in plan.stages) if plan.split_backward else ()
        return cls(tuple(s.forward_s for s in plan.stages), tuple(s.backward_s for s in plan.stages),
                   tuple(t.forward_s for t in plan.transfers), weights)

    def weights(self) -> tuple[float, ...]:
        return self.weight_s or tuple(b / 2 for b in self.backward_s)


def warmups(policy: str, num_stages: int, num_micro_batches: int) -> list[int]:
    """K_p for every stage under a named policy (plan policies and the ablation ones)."""
    fn = POLICIES.get(policy) or ABLATION_POLICIES.get(policy)
    if fn is None:
        known = sorted(set(POLICIES) | set(ABLATION_POLICIES))
        raise ValueError(f"unknown schedule policy {policy!r} (known: {', '.join(known)})")
    return [fn(num_stages, p, num_micro_batches) for p in range(num_stages)]


def check_warmups(ks: Sequence[int], num_micro_batches: int) -> None:
    """K_p (capped at M) must not increase from head to tail.

    Stage p runs its backward of micro-batch i after min(K_p + i, M) forwards; the backward of i on
    stage p+1 needs min(K_{p+1} + i, M) forwards there, all of which come through stage p. With
    K_p < K_{p+1} stage p waits for a backward that waits for forwards stage p has not run.
    """
    capped = [min(k, num_micro_batches) for k in ks]
    for p, (a, b) in enumerate(zip(capped, capped[1:])):
        if a < b:
            raise ValueError(f"K_p must not increase from head to tail: stage {p} has K = {a}, stage {p + 1} has "
                             f"K = {b} (capped at M = {num_micro_batches}); stage {p} would wait for a backward "
                             f"that needs forwards it has not run")


def compute_order(warmup: int, num_micro_batches: int) -> list[tuple[str, int]]:
    """K forwards, then one backward and one forward alternately, then the remaining backwards."""
    k = max(1, min(warmup, num_micro_batches))
    order = [("F", m) for m in range(k)]
    for m in range(num_micro_batches):
        order.append(("B", m))
        if k + m < num_micro_batches:
            order.append(("F", k + m))
    return order


def schedule_for_plan(plan: HppPlan, policy: str | None = None, warmup: Sequence[int] | None = None) -> Schedule:
    """The schedule a plan runs: its own policy unless `policy` or explicit `warmup` K_p override it."""
    P, M = len(plan.stages), plan.num_micro_batches
    if plan.split_backward and (policy in ASYNC_POLICIES or is_bipartition(plan.stages)):
        raise ValueError("split backwards run only in synchronous schedules without Bi-Partition's split layers")
    if policy in ASYNC_POLICIES:  # nf1b, pipedream: a window of mini-batches, not a round (schedule/nf1b.py)
        return async_schedule_for_plan(plan, policy, num_mini_batches=SIMULATED_WINDOW)
    if warmup is not None:
        ks, name = [min(int(k), M) for k in warmup], "warmup:" + ",".join(str(k) for k in warmup)
        if len(ks) != P or min(ks) < 1:
            raise ValueError(f"warmup needs {P} positive values (one per stage: micro-batches in flight), got {list(warmup)}")
    elif policy is None and [s.warmup for s in plan.stages] != warmups(plan.schedule, P, M):
        ks, name = [s.warmup for s in plan.stages], "warmup:" + ",".join(str(s.warmup) for s in plan.stages)
    else:
        name = policy or plan.schedule
        ks = warmups(name, P, M)
    stages = [ScheduleStage(layers=list(s.layers), devices=list(s.devices), samples=list(s.samples), warmup=k,
                            in_flight_cap=max(k, s.in_flight_cap) if s.in_flight_cap else None)
              for s, k in zip(plan.stages, ks)]
    schedule = generate(stages, micro_batch=plan.micro_batch, num_micro_batches=M, policy=name,
                        durations=Durations.of_plan(plan), model=plan.model, profile_digest=plan.profile_digest,
                        split_backward=plan.split_backward)
    return add_split_actions(schedule, plan) if is_bipartition(plan.stages) else schedule


def generate(stages: Sequence[ScheduleStage], *, micro_batch: int, num_micro_batches: int, policy: str,
             durations: Durations | None = None, model: str = "", profile_digest: str = "",
             split_backward: bool = False) -> Schedule:
    """Per-device actions for `stages` (each with its K_p in `warmup`) over one round of M micro-batches."""
    M, P = num_micro_batches, len(stages)
    check_warmups([s.warmup for s in stages], M)
    durations = durations or Durations.unit(P)
    cuts = [routes(a.devices, a.samples, b.devices, b.samples) for a, b in zip(stages, stages[1:])]
    replay = _Replay(stages, cuts, M, durations, split_backward)
    actions = {d: _device_actions(replay, p, i, d) for p, s in enumerate(stages) for i, d in enumerate(s.devices)}
    return Schedule(policy=policy, model=model, profile_digest=profile_digest, micro_batch=micro_batch,
                    num_micro_batches=M, stages=list(stages), actions=actions)


class _Replay:
    """The compute order replayed on integer ticks with unbounded buffers: start/end of every F and B."""

    def __init__(self, stages: Sequence[ScheduleStage], cuts: list[list[Route]], M: int, durations: Durations,
                 split_backward: bool = False):
        self.stages, self.cuts, self.M, self.split = stages, cuts, M, split_backward
        B = sum(stages[0].samples)
        longest = max([*durations.forward_s, *durations.backward_s, *durations.transfer_s, 1e-300])
        tick = longest / _TICKS
        self.f_ticks = [max(1, round(x / tick)) for x in durations.forward_s]
        self.b_ticks = [max(1, round(x / tick)) for x in durations.backward_s]
        if split_backward:  # the head's I has no input gradient to compute: its W is the whole backward
            # Elsewhere both halves take >= 1 tick: a send keyed at its producer's end must follow it.
            self.b_ticks = [max(2, b) for b in self.b_ticks]
            w_ticks = [b if p == 0 else min(b - 1, max(1, round(w / tick)))
                       for p, (b, w) in enumerate(zip(self.b_ticks, durations.weights()))]
            self.b_ticks, self.w_ticks = [b - w for b, w in zip(self.b_ticks, w_ticks)], w_ticks
        # Ticks per route: the cut's per-micro-batch time, pro rata to the route's samples.
        self.route_ticks = [[round(durations.transfer_s[c] * r.samples / B / tick) for r in cut]
                            for c, cut in enumerate(cuts)]
        self.active = {d for s in stages for d, y in zip(s.devices, s.samples) if y > 0}
        self.into = {d: [] for s in stages for d in s.devices}  # device -> [(cut, route index)] arriving
        self.out = {d: [] for s in stages for d in s.devices}   # device -> [(cut, route index)] leaving
        for c, cut in enumerate(cuts):
            for k, r in enumerate(cut):
                self.out[r.src].append((c, k))
                self.into[r.dst].append((c, k))
        self.stage_of = {d: p for p, s in enumerate(stages) for d in s.devices}
        self.order = [compute_order(s.warmup, M) for s in stages]
        self.ops: dict[str, list[tuple[str, int]]] = {}
        """Per device, the computes in the order it runs them (the stage's order, with Ws placed)."""
        self.start: dict[str, list[int]] = {}
        self.f_end: dict[str, list[int | None]] = {d: [None] * M for d in self.stage_of}
        self.b_end: dict[str, list[int | None]] = {d: [None] * M for d in self.stage_of}
        """End of each micro-batch's B, or of its I when backwards are split (what SG and RG wait for)."""
        self.w_end: dict[str, list[int | None]] = {d: [None] * M for d in self.stage_of}
        self._run()

    def _inputs(self, device: str, kind: str, m: int) -> list[int] | None:
        """Arrival ticks of everything (kind, m) on `device` consumes, or None if one is not produced yet."""
        arrivals = []
        if kind == "F":
            for c, k in self.into[device]:
                end = self.f_end[self.cuts[c][k].src][m]
                if end is None:
                    return None
                arrivals.append(end + self.route_ticks[c][k])
        else:
            for c, k in self.out[device]:
                end = self.b_end[self.cuts[c][k].dst][m]
                if end is None:
                    return None
                arrivals.append(end + self.route_ticks[c][k])
        return arrivals

    def _run(self) -> None:
        pending = [d for d in self.stage_of if d in self.active]
        position = {d: 0 for d in pending}
        self.clock = {d: 0 for d in pending}
        self.deferred: dict[str, list[int]] = {d: [] for d in pending}  # micro-batches whose W is to run
        self.forwards = {d: 0 for d in pending}
        self.weighted = {d: 0 for d in pending}
        for d in pending:
            self.start[d], self.ops[d] = [], []
        while pending:
            progressed, still = False, []
            for d in pending:
                p, order = self.stage_of[d], self.order[self.stage_of[d]]
                while position[d] < len(order):
                    kind, m = order[position[d]]
                    arrivals = self._inputs(d, kind, m)
                    if arrivals is None:
                        break
                    ready = max([self.clock[d], *arrivals])
                    while self.deferred[d] and (self.clock[d] < ready or self._memory_full(d, kind)):
                        self._run_weights(d)
                    begin = max(self.clock[d], ready)
                    self.clock[d] = begin + (self.f_ticks[p] if kind == "F" else self.b_ticks[p])
                    self._record(d, ("I" if self.split else "B") if kind == "B" else "F", m, begin)
                    (self.f_end if kind == "F" else self.b_end)[d][m] = self.clock[d]
                    if kind == "F":
                        self.forwards[d] += 1
                    elif self.split:
                        self.deferred[d].append(m)
                    position[d] += 1
                    progressed = True
                if position[d] < len(order):
                    still.append(d)
                while self.deferred[d] and position[d] == len(order):
                    self._run_weights(d)
            if not progressed:
                raise AssertionError(f"compute order cannot complete (devices {still[:4]} wait); warmups invalid?")
            pending = still

    def _memory_full(self, d: str, kind: str) -> bool:
        """Would a forward now hold more than the stage's cap of micro-batches (Ws pending count too)?"""
        stage = self.stages[self.stage_of[d]]
        return kind == "F" and self.forwards[d] - self.weighted[d] >= (stage.in_flight_cap or stage.warmup)

    def _run_weights(self, d: str) -> None:
        m = self.deferred[d].pop(0)
        begin = self.clock[d]
        self.clock[d] = self.w_end[d][m] = begin + self.w_ticks[self.stage_of[d]]
        self.weighted[d] += 1
        self._record(d, "W", m, begin)

    def _record(self, d: str, kind: str, m: int, begin: int) -> None:
        self.ops[d].append((kind, m))
        self.start[d].append(begin)


def _device_actions(replay: _Replay, p: int, index: int, device: str) -> list[Action]:
    """Merge the device's compute order with its transfers, each placed by its global (tick, id) key."""
    stage, M = replay.stages[p], replay.M
    lo, hi = owned_ranges(stage.samples)[index]
    comms: list[tuple[tuple, Action]] = []
    computes: list[Action] = []
    if hi > lo:
        computes = [Action(kind=k, stage=p, micro_batch=m, start=lo, end=hi) for k, m in replay.ops[device]]
        for c, k in replay.out[device]:
            r = replay.cuts[c][k]
            for m in range(M):
                comms.append(((replay.f_end[device][m], 0, c, k, m),
                              Action(kind="SA", stage=p, micro_batch=m, start=r.start, end=r.end, peer=r.dst)))
                comms.append(((replay.b_end[r.dst][m], 1, c, k, m),
                              Action(kind="RG", stage=p, micro_batch=m, start=r.start, end=r.end, peer=r.dst)))
        for c, k in replay.into[device]:
            r = replay.cuts[c][k]
            for m in range(M):
                comms.append(((replay.f_end[r.src][m], 0, c, k, m),
                              Action(kind="RA", stage=p, micro_batch=m, start=r.start, end=r.end, peer=r.src)))
                comms.append(((replay.b_end[device][m], 1, c, k, m),
                              Action(kind="SG", stage=p, micro_batch=m, start=r.start, end=r.end, peer=r.src)))
    if len(stage.devices) > 1:
        ends = replay.w_end if replay.split else replay.b_end  # the group's last B or W
        last = max((e for d in stage.devices for e in ends[d] if e is not None), default=0)
        comms.append(((last, 2, p, 0, 0), Action(kind="AR", stage=p)))
    comms.sort(key=lambda item: item[0])
    starts = replay.start.get(device, [])
    out: list[Action] = []
    i = 0
    for key, action in comms:
        # Comm before compute on equal ticks: a receive lands before the compute that starts when it
        # arrives; a send's tick is its producer's end, which is after that producer's start.
        while i < len(computes) and starts[i] < key[0]:
            out.append(computes[i])
            i += 1
        out.append(action)
    out.extend(computes[i:])
    out.append(Action(kind="STEP", stage=p))
    return out
