"""Schedule generators: per-device action lists for one HPP round.

Compute order per stage (every device of a stage follows it):

- `1f1b-asteroid`: K_p = min(2(P-p)-1, M) forwards, then alternate one backward and one forward
  (Asteroid §3.2, Fig. 4b; P = 3, M = 5 gives K = 5, 3, 1);
- `1f1b`: K_p = min(P-p, M) (PipeDream-Flush / DAPPLE);
- `gpipe`: K_p = M (all forwards, then all backwards);
- any explicit list of K_p (the Fig. 15b ablation uses 2(P-p), 2(P-p)+1).

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

    @classmethod
    def unit(cls, num_stages: int) -> "Durations":
        return cls((1.0,) * num_stages, (2.0,) * num_stages, (0.0,) * max(num_stages - 1, 0))

    @classmethod
    def of_plan(cls, plan: HppPlan) -> "Durations":
        return cls(tuple(s.forward_s for s in plan.stages), tuple(s.backward_s for s in plan.stages),
                   tuple(t.forward_s for t in plan.transfers))


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
    stages = [ScheduleStage(layers=list(s.layers), devices=list(s.devices), samples=list(s.samples), warmup=k)
              for s, k in zip(plan.stages, ks)]
    schedule = generate(stages, micro_batch=plan.micro_batch, num_micro_batches=M, policy=name,
                        durations=Durations.of_plan(plan), model=plan.model, profile_digest=plan.profile_digest)
    return add_split_actions(schedule, plan) if is_bipartition(plan.stages) else schedule


def generate(stages: Sequence[ScheduleStage], *, micro_batch: int, num_micro_batches: int, policy: str,
             durations: Durations | None = None, model: str = "", profile_digest: str = "") -> Schedule:
    """Per-device actions for `stages` (each with its K_p in `warmup`) over one round of M micro-batches."""
    M, P = num_micro_batches, len(stages)
    check_warmups([s.warmup for s in stages], M)
    durations = durations or Durations.unit(P)
    cuts = [routes(a.devices, a.samples, b.devices, b.samples) for a, b in zip(stages, stages[1:])]
    replay = _Replay(stages, cuts, M, durations)
    actions = {d: _device_actions(replay, p, i, d) for p, s in enumerate(stages) for i, d in enumerate(s.devices)}
    return Schedule(policy=policy, model=model, profile_digest=profile_digest, micro_batch=micro_batch,
                    num_micro_batches=M, stages=list(stages), actions=actions)


class _Replay:
    """The compute order replayed on integer ticks with unbounded buffers: start/end of every F and B."""

    def __init__(self, stages: Sequence[ScheduleStage], cuts: list[list[Route]], M: int, durations: Durations):
        self.stages, self.cuts, self.M = stages, cuts, M
        B = sum(stages[0].samples)
        longest = max([*durations.forward_s, *durations.backward_s, *durations.transfer_s, 1e-300])
        tick = longest / _TICKS
        self.f_ticks = [max(1, round(x / tick)) for x in durations.forward_s]
        self.b_ticks = [max(1, round(x / tick)) for x in durations.backward_s]
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
        self.start: dict[str, list[int]] = {}
        self.f_end: dict[str, list[int | None]] = {d: [None] * M for d in self.stage_of}
        self.b_end: dict[str, list[int | None]] = {d: [None] * M for d in self.stage_of}
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
        clock = {d: 0 for d in pending}
        for d in pending:
            self.start[d] = []
        while pending:
            progressed, still = False, []
            for d in pending:
                p, order = self.stage_of[d], self.order[self.stage_of[d]]
                while position[d] < len(order):
                    kind, m = order[position[d]]
                    arrivals = self._inputs(d, kind, m)
                    if arrivals is None:
                        break
                    begin = max([clock[d], *arrivals])
                    clock[d] = begin + (self.f_ticks[p] if kind == "F" else self.b_ticks[p])
                    self.start[d].append(begin)
                    (self.f_end if kind == "F" else self.b_end)[d][m] = clock[d]
                    position[d] += 1
                    progressed = True
                if position[d] < len(order):
                    still.append(d)
            if not progressed:
                raise AssertionError(f"compute order cannot complete (devices {still[:4]} wait); warmups invalid?")
            pending = still


def _device_actions(replay: _Replay, p: int, index: int, device: str) -> list[Action]:
    """Merge the device's compute order with its transfers, each placed by its global (tick, id) key."""
    stage, M = replay.stages[p], replay.M
    lo, hi = owned_ranges(stage.samples)[index]
    comms: list[tuple[tuple, Action]] = []
    computes: list[Action] = []
    if hi > lo:
        computes = [Action(kind=k, stage=p, micro_batch=m, start=lo, end=hi) for k, m in replay.order[p]]
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
        last = max((replay.b_end[d][M - 1] or 0) for d in stage.devices)
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
