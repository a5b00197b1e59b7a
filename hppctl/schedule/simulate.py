"""Replay a schedule in discrete events on a profile's (or a plan's) timings.

Model (docs/simulator.md):

- a device runs its actions in list order, one compute (F, B, I, W, STEP) at a time; a split
  backward's `I` takes the backward less its weight gradients, its `W` those (timings.py);
- a transfer takes bytes / bandwidth of its link; links are full duplex (a device's sends and
  receives do not slow each other); a device's sends share its uplink, one after another in the
  order it posts them (the same total time as fair sharing, completion in post order);
- `mode="async"` (default, what the runtime does): a send is posted (isend) and the device goes on,
  the transfer starts as soon as the uplink is free; a receive is posted early (irecv) and the
  compute that consumes it waits for the data; `mode="blocking"`: send and receive are rendezvous,
  both devices wait from the later of their two posts until the transfer ends;
- AllReduce is a ring over the group taking 2(n-1)/n x gradient bytes over the slowest link of the
  group (Eq. 5), in `allreduce_buckets` equal buckets summed one after another: a member's last
  backward (its last `W` when backwards are split) produces bucket k at k/n of its length (a member without samples, at its AR), bucket k
  starts once every member has it and bucket k-1 is summed, and each member's AR waits for the
  last bucket (what the runtime's gradient hooks do, runtime/reducer.py); the buckets do not queue
  behind the member's sends;
- activation memory on a device: samples forwarded and not yet backwarded (not yet through their
  `W` when split) x per-sample activation bytes of its stage (Eq. 3 with the observed number of micro-batches in flight).

Every event's time is a function of its device's previous event and of the one partner event it
waits for (an arrival, a rendezvous, the last AllReduce post), so the replay visits each action
once, in dependency order, with no global event queue: O(actions).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal, Protocol

from hppctl.errors import BadInput, HppctlError
from hppctl.models.plan import HppPlan
from hppctl.models.reports import allreduce_lane
from hppctl.models.schedule import COMPUTE_KINDS, Schedule
from hppctl.schedule.async_check import versions_held
from hppctl.schedule.routing import owned_ranges

Mode = Literal["async", "blocking"]


class Timings(Protocol):
    def compute_s(self, device: str, stage: int, kind: str, samples: int) -> float: ...
    def message_bytes(self, cut: int, samples: int) -> int: ...
    def transfer_s(self, src: str, dst: str, cut: int, samples: int) -> float: ...
    def allreduce_s(self, stage: int) -> float: ...
    def allreduce_bytes(self, stage: int) -> int: ...
    def allreduce_buckets(self, stage: int) -> int: ...
    def step_s(self, device: str, stage: int) -> float: ...
    def activation_bytes_per_sample(self, stage: int) -> int | None: ...
    def fixed_bytes(self, stage: int) -> int | None: ...
    def budget_bytes(self, device: str) -> int | None: ...


class SimulationStuck(HppctlError):
    """The replay could not finish: the schedule was not checked (or the checker missed a rule)."""


@dataclass
class Span:
    """One interval on a track of the timeline (`track` is a device name or `src->dst`)."""

    track: str
    name: str
    category: str  # forward, backward, allreduce, step, activations, gradients
    start_s: float
    duration_s: float
    args: dict = field(default_factory=dict)


@dataclass
class DeviceStats:
    device: str
    stage: int
    samples: int
    compute_s: float = 0.0
    """Forward + backward + optimizer step."""
    allreduce_s: float = 0.0
    """The AllReduce's exposed part: from the member's AR until the last bucket is summed."""
    finish_s: float = 0.0
    peak_in_flight_micro_batches: int = 0
    peak_in_flight_samples: int = 0
    activation_bytes_per_sample: int | None = None
    fixed_bytes: int | None = None
    budget_bytes: int | None = None
    memory_samples: list[tuple[float, int]] = field(default_factory=list)
    """(time, samples in flight) after every change; kept only when tracing."""
    weight_versions: int = 1
    """Most weight versions held at once (asynchronous schedules: stashed for tagged F/B)."""
    stash_bytes: int | None = 0
    """Bytes of the weight versions beyond the latest (None: parameter bytes unknown)."""

    @property
    def peak_activation_bytes(self) -> int | None:
        per = self.activation_bytes_per_sample
        return None if per is None else self.peak_in_flight_samples * per

    @property
    def peak_memory_bytes(self) -> int | None:
        act = self.peak_activation_bytes
        if act is None or self.fixed_bytes is None or self.stash_bytes is None:
            return None
        return self.fixed_bytes + act + self.stash_bytes


@dataclass
class LinkStats:
    src: str
    dst: str
    bytes: int = 0
    busy_s: float = 0.0
    messages: int = 0


@dataclass
class SimResult:
    mode: Mode
    round_latency_s: float
    samples_per_round: int
    devices: list[DeviceStats]
    links: list[LinkStats]
    spans: list[Span]

    @property
    def throughput_samples_per_s(self) -> float:
        return self.samples_per_round / self.round_latency_s if self.round_latency_s > 0 else 0.0

    def busy_fraction(self, d: DeviceStats) -> float:
        return d.compute_s / self.round_latency_s if self.round_latency_s > 0 else 0.0

    def bubble_fraction(self, d: DeviceStats) -> float:
        """Share of the round the device neither computes nor takes part in an AllReduce."""
        if self.round_latency_s <= 0:
            return 0.0
        return max(0.0, 1.0 - (d.compute_s + d.allreduce_s) / self.round_latency_s)


RELEASING_KINDS = ("B", "W")
"""The compute that frees a micro-batch's saved activations (a split backward keeps them for its W),
and whose gradient hooks start a replicated stage's AllReduce buckets when it is the last."""


def simulate(schedule: Schedule, timings: Timings, *, mode: Mode = "async", trace: bool = False) -> SimResult:
    """Replay one round of `schedule` (already checked) and measure it."""
    return _Replay(schedule, timings, mode, trace).run()


class _Replay:
    def __init__(self, schedule: Schedule, timings: Timings, mode: Mode, trace: bool):
        self.s, self.tm, self.mode, self.trace = schedule, timings, mode, trace
        self.programs = schedule.actions
        self.stage_of = {d: p for p, st in enumerate(schedule.stages) for d in st.devices}
        self.groups = {p: st.devices for p, st in enumerate(schedule.stages)}
        self.pc = {d: 0 for d in self.programs}
        self.clock = {d: 0.0 for d in self.programs}
        self.uplink = {d: 0.0 for d in self.programs}
        self.arrival: dict[tuple, float] = {}
        self.waiters: dict[tuple, list[str]] = defaultdict(list)
        self.posted: dict[tuple, float] = {}  # blocking mode: key + side -> post time
        self.ar_posted: dict[int, dict[str, float]] = defaultdict(dict)
        self.last_backward: dict[str, tuple[float, float]] = {}
        """(start, end) of each device's latest B (or W): at its AR, the one whose hooks start the buckets."""
        self.in_flight = {d: [0, 0] for d in self.programs}  # micro-batches, samples
        self.needs = {d: self._needs(d) for d in self.programs}
        self.spans: list[Span] = []
        self.links: dict[tuple[str, str], LinkStats] = {}
        self.stats = {}
        for p, st in enumerate(schedule.stages):
            for d, (lo, hi) in zip(st.devices, owned_ranges(st.samples)):
                self.stats[d] = DeviceStats(d, p, hi - lo, activation_bytes_per_sample=timings.activation_bytes_per_sample(p),
                                            fixed_bytes=timings.fixed_bytes(p), budget_bytes=timings.budget_bytes(d))
        self._durations: dict[tuple, float] = {}
        if schedule.micro_batches_per_update is not None:
            for d, held in versions_held(schedule).items():
                param_bytes = timings.allreduce_bytes(self.stage_of[d])
                self.stats[d].weight_versions = held
                self.stats[d].stash_bytes = (held - 1) * param_bytes if param_bytes else (0 if held == 1 else None)

    def _needs(self, device: str) -> dict[int, list[tuple]]:
        """For each compute action (by index), the transfer keys whose data it consumes."""
        pending: dict[tuple[str, int], list[tuple]] = defaultdict(list)
        out: dict[int, list[tuple]] = {}
        for i, a in enumerate(self.programs[device]):
            if a.kind in ("RA", "RG", "RX"):  # RX: a Bi-Partition split block's input, for the backward
                pending[("RG" if a.kind == "RX" else a.kind, a.micro_batch)].append(_key(a, device))
            elif a.kind in ("F", "B", "I"):
                keys = pending[("RA" if a.kind == "F" else "RG", a.micro_batch)]
                mine = [k for k in keys if a.start <= k[4] and k[5] <= a.end]
                if mine:
                    out[i] = mine
                    pending[("RA" if a.kind == "F" else "RG", a.micro_batch)] = [k for k in keys if k not in mine]
        return out

    def run(self) -> SimResult:
        runnable = list(self.programs)
        while runnable:
            woken: list[str] = []
            for d in runnable:
                self._advance(d, woken)
            runnable = woken
        stuck = [d for d in self.programs if self.pc[d] < len(self.programs[d])]
        if stuck:
            d = stuck[0]
            raise SimulationStuck(f"simulation stuck: {d} at {self.programs[d][self.pc[d]]} (run the checker)")
        latency = max([*self.clock.values(), *self.uplink.values(), 0.0])
        for d, st in self.stats.items():
            st.finish_s = self.clock[d]
        return SimResult(self.mode, latency, self.s.micro_batch * self.s.num_micro_batches, list(self.stats.values()),
                         list(self.links.values()), self.spans)

    # -- one device until it blocks ----------------------------------------------------------------
    def _advance(self, d: str, woken: list[str]) -> None:
        actions, pc = self.programs[d], self.pc
        while pc[d] < len(actions):
            a = actions[pc[d]]
            kind = a.kind
            if kind in COMPUTE_KINDS:
                if not self._compute(d, pc[d], a, woken):
                    return
            elif kind in ("SA", "SG", "SX", "SW"):
                if self.mode == "async":
                    self._send_async(d, a, woken)
                elif not self._rendezvous(d, a, woken, sender=True):
                    return
            elif kind in ("RA", "RG", "RX", "RW"):
                if self.mode == "blocking" and not self._rendezvous(d, a, woken, sender=False):
                    return
            elif kind == "AR":
                if not self._allreduce(d, a, woken):
                    return
                continue  # _allreduce advanced every member's pc
            else:  # STEP
                dur = self.tm.step_s(d, a.stage)
                self._span(d, f"STEP{a.stage}", "step", self.clock[d], dur)
                self.clock[d] += dur
                self.stats[d].compute_s += dur
            pc[d] += 1

    def _compute(self, d: str, index: int, a, woken: list[str]) -> bool:
        begin = self.clock[d]
        for key in self.needs[d].get(index, ()):
            t = self.arrival.get(key)
            if t is None:
                self.waiters[key].append(d)
                return False
            if t > begin:
                begin = t
        y = a.end - a.start
        cache = (d, a.kind)
        dur = self._durations.get(cache)
        if dur is None:
            dur = self._durations[cache] = self.tm.compute_s(d, a.stage, a.kind, y)
        stats, flight = self.stats[d], self.in_flight[d]
        if a.kind == "F":
            flight[0] += 1
            flight[1] += y
            stats.peak_in_flight_micro_batches = max(stats.peak_in_flight_micro_batches, flight[0])
            stats.peak_in_flight_samples = max(stats.peak_in_flight_samples, flight[1])
            if self.trace:
                stats.memory_samples.append((begin, flight[1]))
        end = begin + dur
        if a.kind in RELEASING_KINDS:
            flight[0] -= 1
            flight[1] -= y
            self.last_backward[d] = (begin, end)
            if self.trace:
                stats.memory_samples.append((end, flight[1]))
        self.clock[d] = end
        stats.compute_s += dur
        if self.trace:
            self._span(d, str(a), "forward" if a.kind == "F" else "backward", begin, dur,
                       {"micro_batch": a.micro_batch, "samples": f"[{a.start}:{a.end})"})
        return True

    def _transfer(self, src: str, dst: str, a, ready: float) -> float:
        """Put one message on src's uplink no earlier than `ready`; return its arrival time."""
        cut = min(self.stage_of[src], self.stage_of[dst])  # the cut after the upstream stage
        y = a.samples
        sized = getattr(self.tm, "action_transfer", None)  # profile timings size each kind at its own cut
        nbytes, dur = sized(src, dst, cut, a) if sized else (self.tm.message_bytes(cut, y),
                                                             self.tm.transfer_s(src, dst, cut, y))
        begin = max(ready, self.uplink[src])
        end = begin + dur
        self.uplink[src] = end
        link = self.links.get((src, dst))
        if link is None:
            link = self.links[(src, dst)] = LinkStats(src, dst)
        link.bytes += nbytes
        link.busy_s += dur
        link.messages += 1
        if self.trace:
            grad = a.kind in ("SG", "RG")
            self._span(f"{src}->{dst}", f"{a.micro_batch}{'G' if grad else 'A'}[{a.start}:{a.end}]",
                       "gradients" if grad else "activations", begin, dur,
                       {"micro_batch": a.micro_batch, "bytes": nbytes})
        return end

    def _deliver(self, key: tuple, t: float, woken: list[str]) -> None:
        self.arrival[key] = t
        waiting = self.waiters.pop(key, None)
        if waiting:
            woken.extend(waiting)

    def _send_async(self, d: str, a, woken: list[str]) -> None:
        key = _key(a, d)
        self._deliver(key, self._transfer(d, a.peer, a, self.clock[d]), woken)

    def _rendezvous(self, d: str, a, woken: list[str], *, sender: bool) -> bool:
        """Blocking mode: the later of the two posts starts the transfer; both wait until it ends."""
        key = _key(a, d)
        other = (key, not sender)
        if other not in self.posted:
            self.posted[(key, sender)] = self.clock[d]
            return False
        t_other = self.posted.pop(other)
        src, dst = (d, a.peer) if sender else (a.peer, d)
        end = self._transfer(src, dst, a, max(self.clock[d], t_other))
        self.clock[src] = self.clock[dst] = end
        peer = a.peer
        self.pc[peer] += 1
        woken.append(peer)
        self._deliver(key, end, woken)
        return True

    def _allreduce(self, d: str, a, woken: list[str]) -> bool:
        posted = self.ar_posted[a.stage]
        posted[d] = max(self.clock[d], self.uplink[d])
        members = self.groups[a.stage]
        if len(posted) < len(members):
            return False
        buckets = self._buckets(a.stage, members, posted)
        finish = buckets[-1][1]
        for e in members:
            done = max(finish, posted[e])
            self.stats[e].allreduce_s += done - posted[e]
            self.clock[e] = self.uplink[e] = done
            self.pc[e] += 1
            if e != d:
                woken.append(e)
            self._span(e, f"AR{a.stage}", "allreduce", posted[e], done - posted[e],
                       {"bytes": self.tm.allreduce_bytes(a.stage), "buckets": len(buckets)})
            if len(buckets) > 1:
                for k, (start, end) in enumerate(buckets):
                    self._span(allreduce_lane(e), f"AR{a.stage} bucket {k}", "allreduce", start, end - start)
        return True

    def _buckets(self, stage: int, members, posted: dict[str, float]) -> list[tuple[float, float]]:
        """(start, end) of each bucket's sum: bucket k (1..n) ready on a member at k/n of its last
        backward (at its AR without one), started when ready everywhere and bucket k-1 is done."""
        n = getattr(self.tm, "allreduce_buckets", lambda _stage: 1)(stage)
        piece = self.tm.allreduce_s(stage) / n
        out, previous = [], -math.inf
        for k in range(1, n + 1):
            ready = max(self._bucket_ready(e, k, n, posted[e]) for e in members)
            start = max(ready, previous)
            previous = start + piece
            out.append((start, previous))
        return out

    def _bucket_ready(self, e: str, k: int, n: int, posted: float) -> float:
        if e not in self.last_backward:  # no samples: every bucket starts at its AR
            return posted
        begin, end = self.last_backward[e]
        return end if k == n else begin + (end - begin) * k / n

    def _span(self, track: str, name: str, category: str, start: float, dur: float, args: dict | None = None) -> None:
        if self.trace:
            self.spans.append(Span(track, name, category, start, dur, args or {}))


def _key(a, device: str) -> tuple:
    """The identity of a transfer, the same on both ends: (channel, src, dst, m, start, end)."""
    if a.kind in ("SX", "RX", "SW", "RW"):
        src, dst = (device, a.peer) if a.kind[0] == "S" else (a.peer, device)
        return (a.kind[1], src, dst, a.micro_batch, a.start, a.end)
    if a.kind == "SA":
        return ("A", device, a.peer, a.micro_batch, a.start, a.end)
    if a.kind == "RA":
        return ("A", a.peer, device, a.micro_batch, a.start, a.end)
    if a.kind == "SG":
        return ("G", device, a.peer, a.micro_batch, a.start, a.end)
    return ("G", a.peer, device, a.micro_batch, a.start, a.end)


def check_schedule_matches(schedule, plan: HppPlan, source: str) -> None:
    """A schedule file must describe the plan's stages, devices, allocation and round."""
    if (schedule.micro_batch, schedule.num_micro_batches) != (plan.micro_batch, plan.num_micro_batches):
        raise BadInput(f"{source}: micro_batch x num_micro_batches: schedule is {schedule.micro_batch} x "
                       f"{schedule.num_micro_batches}, plan is {plan.micro_batch} x {plan.num_micro_batches}")
    mine = [(s.layers, s.devices, s.samples) for s in schedule.stages]
    theirs = [(s.layers, s.devices, s.samples) for s in plan.stages]
    if mine != theirs:
        p = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        raise BadInput(f"{source}: stages.{p}: schedule's stages (layers, devices, samples) differ from the plan's")


def result_document(plan: HppPlan, schedule, result, *, with_profile: bool) -> dict:
    """`hppctl simulate --json`: the simulated round against the plan's estimate, per device and link."""
    est = plan.prediction.round_latency_s
    return {
        "policy": schedule.policy,
        "mode": result.mode,
        "timings": "profile" if with_profile else "plan",
        "round_latency_s": result.round_latency_s,
        "throughput_samples_per_s": result.throughput_samples_per_s,
        "estimate": {"round_latency_s": est, "throughput_samples_per_s": plan.prediction.throughput_samples_per_s,
                     "error": (est - result.round_latency_s) / result.round_latency_s if result.round_latency_s else None},
        "warmup": [s.warmup for s in schedule.stages],
        "devices": [{
            "device": d.device, "stage": d.stage, "samples": d.samples, "compute_s": d.compute_s,
            "allreduce_s": d.allreduce_s, "finish_s": d.finish_s, "busy_fraction": result.busy_fraction(d),
            "bubble_fraction": result.bubble_fraction(d), "peak_in_flight_micro_batches": d.peak_in_flight_micro_batches,
            "peak_in_flight_samples": d.peak_in_flight_samples, "peak_activation_bytes": d.peak_activation_bytes,
            "peak_memory_bytes": d.peak_memory_bytes, "budget_bytes": d.budget_bytes,
            "weight_versions": d.weight_versions,
        } for d in result.devices],
        "links": [{"src": link.src, "dst": link.dst, "bytes": link.bytes, "busy_s": link.busy_s,
                   "messages": link.messages} for link in result.links],
    }
