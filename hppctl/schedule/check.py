"""One checker for every schedule, generated or loaded: the runtime and the simulator trust its verdict.

`check_schedule` raises `ScheduleError` naming the device, the action's position and text, and the
rule broken. Rules, in the order they are checked:

1. every action is well-formed for its device: its own stage, a micro-batch < M, a sample range
   inside the micro-batch, a peer in the adjacent stage (SA/RG: next stage, RA/SG: previous);
2. per stage and micro-batch, the forwards of the stage's devices cover every sample exactly once,
   and on each device the backwards cover exactly the samples it forwarded, each after its forward;
3. data flow on each device: a forward's input arrives (RA) before it and its output leaves (SA)
   after it; a backward's gradient arrives (RG) before it and its input gradient leaves (SG) after
   it; received and sent ranges tile the computed ones exactly;
4. gradients return to the device that ran the forward: a device's RG equal its SA and its SG
   equal its RA (same peers, micro-batches and ranges);
5. every send has exactly one matching receive on its peer, and vice versa;
6. a multi-device stage runs one AllReduce per device, after its last backward (so the AllReduce
   is the last use of the gradients) and before STEP; a single-device stage runs none; STEP is
   each device's last action, exactly once;
7. no deadlock when every send, receive and AllReduce blocks until all its parties arrive: the
   schedule is executed by matching rendezvous; if it gets stuck, the wait-for cycle is reported.
6b. split backwards (`I` + `W`, models/schedule.py's pairing contract): an `I` stands for the
   backward in rules 2-6; on each device the `W`s of a micro-batch tile exactly the samples its
   `I`s covered, each after its `I`, before the `AR`; a device never mixes `B` and `I`.
   Asynchronous and Bi-Partition schedules do not split backwards;
8. Bi-Partition schedules (stages with `backward_layers`; docs/bipartition.md): rules B1-B4 of
   `bipartition.check_bipartition`; SW/RW follow STEP, so rules 1-6 look at the lists without them.

Asynchronous schedules (`micro_batches_per_update` set: `nf1b`, `pipedream`) step after every
mini-batch: rule 6's single STEP is replaced by rules A1–A5 of `async_check` (STEP per mini-batch,
weight version tags, in-flight cap).
"""

from __future__ import annotations

from collections import Counter, defaultdict

from hppctl.errors import BadInput
from hppctl.models.schedule import BACKWARD_KINDS, Action, Schedule
from hppctl.schedule.async_check import check_async
from hppctl.schedule.bipartition import check_bipartition, without_weight_transfers
from hppctl.schedule.routing import owned_ranges


class ScheduleError(BadInput):
    """A schedule breaks one of the checker's rules (exit 2 when it came from a file)."""


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, device: str, index: int | None, action: Action | None, message: str) -> None:
        where = f"{device}" + (f" action {index} {str(action)!r}" if action is not None else "")
        self.items.append(f"{where}: {message}")

    def raise_if_any(self) -> None:
        if self.items:
            more = len(self.items) - 1
            raise ScheduleError(f"schedule: {self.items[0]}" + (f" (and {more} more problem{'s' * (more > 1)})" if more else ""))


def check_schedule(schedule: Schedule) -> None:
    """Raise ScheduleError for the first broken rule (see the module docstring); return None if valid."""
    problems = _Problems()
    stage_of = {d: p for p, s in enumerate(schedule.stages) for d in s.devices}
    _check_actions(schedule, stage_of, problems)
    problems.raise_if_any()
    _check_coverage(schedule, problems)
    for device, actions in schedule.actions.items():
        _check_device_flow(schedule, device, without_weight_transfers(actions), stage_of[device], problems)
    problems.raise_if_any()
    _check_matching(schedule, problems)
    problems.raise_if_any()
    check_bipartition(schedule, problems.add)
    problems.raise_if_any()
    _check_deadlock(schedule, problems)
    problems.raise_if_any()
    check_async(schedule, problems.add)
    problems.raise_if_any()


def _check_actions(schedule: Schedule, stage_of: dict[str, int], problems: _Problems) -> None:
    B, M, P = schedule.micro_batch, schedule.num_micro_batches, len(schedule.stages)
    peer_offset = {"SA": 1, "RG": 1, "RA": -1, "SG": -1}
    unsplittable = _why_no_split_backward(schedule)
    for device, actions in schedule.actions.items():
        p = stage_of[device]
        lo, hi = owned(schedule, device)
        for i, a in enumerate(actions):
            if unsplittable and a.kind in ("I", "W"):
                problems.add(device, i, a, f"{unsplittable} do not split backwards (I/W)")
            elif a.stage != p:
                problems.add(device, i, a, f"names stage {a.stage}, but {device} is in stage {p}")
            elif a.micro_batch is not None and a.micro_batch >= M:
                problems.add(device, i, a, f"micro-batch {a.micro_batch} does not exist (M = {M})")
            elif a.end is not None and a.end > B:
                problems.add(device, i, a, f"sample range ends past the micro-batch (B = {B})")
            elif a.end is not None and not lo <= a.start < a.end <= hi:
                problems.add(device, i, a, f"samples outside the range [{lo}:{hi}) {device} owns in stage {p}")
            elif a.kind in peer_offset:
                want = p + peer_offset[a.kind]
                if not 0 <= want < P:
                    problems.add(device, i, a, f"stage {p} has no {'next' if want > p else 'previous'} stage")
                elif stage_of.get(a.peer) != want:
                    problems.add(device, i, a, f"peer {a.peer} is not a device of stage {want}")


def _why_no_split_backward(schedule: Schedule) -> str:
    """'' if the schedule may split backwards, else what kind of schedule it is."""
    if schedule.micro_batches_per_update is not None:
        return "asynchronous schedules"
    if any(s.backward_layers is not None for s in schedule.stages):
        return "Bi-Partition schedules"
    return ""


def _check_coverage(schedule: Schedule, problems: _Problems) -> None:
    """Rule 2: per stage and micro-batch, forwards and backwards (B or I) each cover [0, B) exactly once."""
    B = schedule.micro_batch
    for p, stage in enumerate(schedule.stages):
        for kinds, label in ((("F",), "forwarded"), (BACKWARD_KINDS, "backwarded")):
            ranges: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
            for device in stage.devices:
                for a in schedule.actions[device]:
                    if a.kind in kinds:
                        ranges[a.micro_batch].append((a.start, a.end, device))
            for m in range(schedule.num_micro_batches):
                covered = 0
                for start, end, device in sorted(ranges.get(m, [])):
                    if start < covered:
                        problems.add(device, None, None, f"stage {p}: samples [{start}:{min(end, covered)}) of "
                                                         f"micro-batch {m} are {label} twice")
                    elif start > covered:
                        problems.add(device, None, None, f"stage {p}: samples [{covered}:{start}) of micro-batch {m} "
                                                         f"are never {label}")
                    covered = max(covered, end)
                if covered < B:
                    problems.add(stage.devices[-1], None, None,
                                 f"stage {p}: samples [{covered}:{B}) of micro-batch {m} are never {label}")


def _check_device_flow(schedule: Schedule, device: str, actions: list[Action], p: int, problems: _Problems) -> None:
    """Rules 3, 4 and 6 on one device."""
    P = len(schedule.stages)
    forwarded: dict[int, list[tuple[int, int]]] = defaultdict(list)  # m -> ranges forwarded so far
    backwarded: dict[int, list[tuple[int, int]]] = defaultdict(list)
    received: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)  # (RA|RG, m) -> ranges
    sent: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    transfers: dict[str, Counter] = {k: Counter() for k in ("SA", "RA", "SG", "RG")}
    allreduce_at, step_at, last_backward = [], [], -1
    halves = _SplitHalves()
    for i, a in enumerate(actions):
        if a.kind == "W":
            last_backward = i
            halves.weights(device, i, a, allreduce_at, problems)
        elif a.kind in ("F", *BACKWARD_KINDS):
            done = forwarded if a.kind == "F" else backwarded
            if any(s < a.end and a.start < e for s, e in done[a.micro_batch]):
                problems.add(device, i, a, f"samples already {'forwarded' if a.kind == 'F' else 'backwarded'} on {device}")
            if a.kind != "F":
                last_backward = i
                halves.backward(device, i, a, problems)
                if not _covers(forwarded[a.micro_batch], a.start, a.end):
                    problems.add(device, i, a, "backward before the forward of these samples on this device")
                if allreduce_at:
                    problems.add(device, i, a, "backward after the AllReduce (gradients changed after they were reduced)")
            needs = "RA" if a.kind == "F" else "RG"
            has_input = p > 0 if a.kind == "F" else p < P - 1
            if has_input and not _covers(received[(needs, a.micro_batch)], a.start, a.end):
                problems.add(device, i, a, f"runs before its {'activations' if a.kind == 'F' else 'gradients'} "
                                           f"[{a.start}:{a.end}) are received ({needs})")
            done[a.micro_batch].append((a.start, a.end))
        elif a.kind in ("SA", "SG"):
            source = forwarded if a.kind == "SA" else backwarded
            if not _covers(source[a.micro_batch], a.start, a.end):
                problems.add(device, i, a, f"sends {'activations' if a.kind == 'SA' else 'gradients'} before the "
                                           f"{'forward' if a.kind == 'SA' else 'backward'} that produces them")
            sent[(a.kind, a.micro_batch)].append((a.start, a.end))
            transfers[a.kind][(a.peer, a.micro_batch, a.start, a.end)] += 1
        elif a.kind in ("RA", "RG"):
            received[(a.kind, a.micro_batch)].append((a.start, a.end))
            transfers[a.kind][(a.peer, a.micro_batch, a.start, a.end)] += 1
        elif a.kind == "AR":
            allreduce_at.append(i)
        elif a.kind == "STEP":
            step_at.append(i)
    _check_tiling(schedule, device, p, forwarded, backwarded, received, sent, problems)
    halves.check_complete(device, problems)
    if transfers["RG"] != transfers["SA"]:
        problems.add(device, None, None, "gradients do not return along the activations' routes "
                                         f"(RG {_diff(transfers['RG'], transfers['SA'])})")
    if transfers["SG"] != transfers["RA"]:
        problems.add(device, None, None, "input gradients are not sent back to where the activations came from "
                                         f"(SG {_diff(transfers['SG'], transfers['RA'])})")
    group = len(schedule.stages[p].devices)
    if group > 1 and len(allreduce_at) != 1:
        problems.add(device, None, None, f"stage {p} has {group} devices: needs exactly one AR{p}, found {len(allreduce_at)}")
    if group == 1 and allreduce_at:
        problems.add(device, allreduce_at[0], actions[allreduce_at[0]], "AllReduce on a single-device stage")
    if allreduce_at and allreduce_at[0] < last_backward:
        problems.add(device, allreduce_at[0], actions[allreduce_at[0]], "AllReduce before the last backward")
    if schedule.micro_batches_per_update is None and (len(step_at) != 1 or step_at[0] != len(actions) - 1):
        problems.add(device, None, None, f"STEP must be the last action, exactly once (found {len(step_at)})")


class _SplitHalves:
    """Rule 6b on one device: every `I` gets exactly one later `W` of its samples, before the AR."""

    def __init__(self) -> None:
        self.inputs: dict[int, list[tuple[int, int]]] = defaultdict(list)  # m -> ranges back-propagated by I
        self.weighted: dict[int, list[tuple[int, int]]] = defaultdict(list)  # m -> ranges W has finished
        self.kinds: set[str] = set()

    def backward(self, device: str, i: int, a: Action, problems: _Problems) -> None:
        self.kinds.add(a.kind)
        if self.kinds == {"B", "I"}:
            problems.add(device, i, a, "mixes whole backwards (B) and split ones (I) on one device")
            self.kinds = {a.kind}  # report the mix once
        if a.kind == "I":
            self.inputs[a.micro_batch].append((a.start, a.end))

    def weights(self, device: str, i: int, a: Action, allreduce_at: list[int], problems: _Problems) -> None:
        m = a.micro_batch
        if not _covers(self.inputs[m], a.start, a.end):
            problems.add(device, i, a, "weight half before the input half (I) of these samples on this device")
        elif any(s < a.end and a.start < e for s, e in self.weighted[m]):
            problems.add(device, i, a, f"weight gradients of these samples already computed on {device}")
        elif allreduce_at:
            problems.add(device, i, a, "weight half after the AllReduce (gradients changed after they were reduced)")
        self.weighted[m].append((a.start, a.end))

    def check_complete(self, device: str, problems: _Problems) -> None:
        for m in sorted(self.inputs):
            if _normal(self.weighted.get(m, [])) != _normal(self.inputs[m]):
                problems.add(device, None, None, f"micro-batch {m}: weight halves {_show(self.weighted.get(m, []))} "
                                                 f"do not tile the input halves {_show(self.inputs[m])} (each I needs its W)")


def _check_tiling(schedule, device, p, forwarded, backwarded, received, sent, problems) -> None:
    """Received and sent ranges tile exactly what the device computed; backwards tile forwards."""
    P = len(schedule.stages)
    for m in range(schedule.num_micro_batches):
        fwd = _normal(forwarded.get(m, []))
        checks = [("B", _normal(backwarded.get(m, [])), "backwards")]
        if p > 0:
            checks += [("RA", received.get(("RA", m), []), "received activations"),
                       ("SG", sent.get(("SG", m), []), "sent input gradients")]
        if p < P - 1:
            checks += [("SA", sent.get(("SA", m), []), "sent activations"),
                       ("RG", received.get(("RG", m), []), "received gradients")]
        for kind, ranges, label in checks:
            if _normal(ranges) != fwd or _has_overlap(ranges):
                problems.add(device, None, None, f"micro-batch {m}: {label} {_show(ranges)} do not tile the "
                                                 f"forwarded samples {_show(fwd)}")


def _check_matching(schedule: Schedule, problems: _Problems) -> None:
    """Rule 5: SA(d->e) == RA(e<-d) and SG(d->e) == RG(e<-d), as multisets."""
    sends: Counter = Counter()
    recvs: Counter = Counter()
    pair = {"SA": "A", "RA": "A", "SG": "G", "RG": "G"}
    for device, actions in schedule.actions.items():
        for a in actions:
            if a.kind in ("SA", "SG"):
                sends[(pair[a.kind], device, a.peer, a.micro_batch, a.start, a.end)] += 1
            elif a.kind in ("RA", "RG"):
                recvs[(pair[a.kind], a.peer, device, a.micro_batch, a.start, a.end)] += 1
    for key in sorted((sends - recvs).keys()):
        kind, src, dst, m, start, end = key
        problems.add(src, None, None, f"send {m}S{kind}>{dst}[{start}:{end}] has no matching receive on {dst}")
    for key in sorted((recvs - sends).keys()):
        kind, src, dst, m, start, end = key
        problems.add(dst, None, None, f"receive {m}R{kind}<{src}[{start}:{end}] has no matching send on {src}")


def _check_deadlock(schedule: Schedule, problems: _Problems) -> None:
    """Rule 7: execute with blocking rendezvous semantics; report a wait-for cycle if it gets stuck."""
    programs = schedule.actions
    pc = {d: 0 for d in programs}
    groups = {p: s.devices for p, s in enumerate(schedule.stages)}
    stage_of = {d: p for p, s in enumerate(schedule.stages) for d in s.devices}
    runnable = list(programs)
    while runnable:
        woken: list[str] = []
        for d in runnable:
            _advance(d, programs, pc, groups, stage_of, woken)
        runnable = woken
    stuck = {d: programs[d][pc[d]] for d in programs if pc[d] < len(programs[d])}
    if not stuck:
        return
    waits = {d: _waits_for(d, a, pc, programs, groups) for d, a in stuck.items()}
    cycle = _find_cycle(waits)
    shown = cycle or sorted(stuck)[:4]
    chain = ", ".join(f"{d} at {stuck[d]} waits for {waits[d]}" for d in shown)
    problems.add(shown[0], pc[shown[0]], stuck[shown[0]],
                 f"deadlock under blocking send/receive: {'cycle ' if cycle else ''}{chain}")


_PARTNER = {"SA": "RA", "SG": "RG", "RA": "SA", "RG": "SG", "SX": "RX", "RX": "SX", "SW": "RW", "RW": "SW"}


def _advance(d: str, programs, pc, groups, stage_of, woken: list[str]) -> None:
    """Run device d until it blocks; complete rendezvous whose last party is d, waking the others."""
    actions = programs[d]
    while pc[d] < len(actions):
        a = actions[pc[d]]
        if a.kind in _PARTNER:
            peer = a.peer
            if pc[peer] < len(programs[peer]):
                b = programs[peer][pc[peer]]
                if (b.kind == _PARTNER[a.kind] and b.peer == d and b.micro_batch == a.micro_batch
                        and b.start == a.start and b.end == a.end):
                    pc[peer] += 1
                    pc[d] += 1
                    woken.append(peer)
                    continue
            return
        if a.kind == "AR":
            members = groups[a.stage]
            if all(pc[e] < len(programs[e]) and programs[e][pc[e]].kind == "AR" for e in members):
                for e in members:
                    pc[e] += 1
                    if e != d:
                        woken.append(e)
                continue
            return
        pc[d] += 1


def _waits_for(d: str, a: Action, pc, programs, groups) -> str:
    if a.kind in _PARTNER:
        return a.peer
    for e in groups[a.stage]:
        if e != d and not (pc[e] < len(programs[e]) and programs[e][pc[e]].kind == "AR"):
            return e
    return d


def _find_cycle(waits: dict[str, str]) -> list[str]:
    for start in sorted(waits):
        path, seen, d = [], set(), start
        while d in waits and d not in seen:
            seen.add(d)
            path.append(d)
            d = waits[d]
        if d in seen:
            return path[path.index(d):]
    return []


def _covers(ranges: list[tuple[int, int]], start: int, end: int) -> bool:
    """Do the (disjoint) ranges cover [start, end)?"""
    need = end - start
    return sum(max(0, min(e, end) - max(s, start)) for s, e in ranges) >= need


def _normal(ranges) -> list[tuple[int, int]]:
    """Union of ranges as sorted disjoint intervals (adjacent ones merged)."""
    out: list[list[int]] = []
    for s, e in sorted(ranges):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _has_overlap(ranges) -> bool:
    reach = -1
    for s, e in sorted(ranges):
        if s < reach:
            return True
        reach = max(reach, e)
    return False


def _show(ranges) -> str:
    return "[" + ", ".join(f"{s}:{e}" for s, e in sorted(ranges)) + "]"


def _diff(a: Counter, b: Counter) -> str:
    extra, missing = a - b, b - a
    items = [f"+{m}[{s}:{e}]@{peer}" for (peer, m, s, e) in sorted(extra)][:2] + \
            [f"-{m}[{s}:{e}]@{peer}" for (peer, m, s, e) in sorted(missing)][:2]
    return " ".join(items)


def owned(schedule: Schedule, device: str) -> tuple[int, int]:
    """The sample range [start, end) a device owns in every micro-batch of its stage."""
    for s in schedule.stages:
        if device in s.devices:
            return owned_ranges(s.samples)[s.devices.index(device)]
    raise KeyError(device)
