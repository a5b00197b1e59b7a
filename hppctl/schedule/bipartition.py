"""Bi-Partition schedules: the 1F1B round of a plan whose stages backward other layers than they forward.

Every stage is one device (a worker). The usual actions keep their meaning, on the worker's own
ranges: `F` runs its forward range (an empty one relays the received activations), `B` its
backward range (an empty one relays the gradients), `SA`/`RA` carry the activations at the forward
cut, `SG`/`RG` the gradients at the backward cut. Split layers add (docs/bipartition.md):

- `SX`/`RX`, per micro-batch: worker w-1 sends worker w the input of w's *prefix split* [b_w, f_w)
  (layers w-1 forwards and w backwards); right after the matching `SA`/`RA`, so both devices meet
  them in the same order. A *suffix split* [f_{w+1}, b_{w+1}) needs no message: its input is the
  worker's own forward output. The backward owner re-runs the split block's forward from it.
- `SW`/`RW`, once per round after `STEP`: the backward owner sends the split layers' new weights to
  their forward owner, before the next round's first forward. Pairs in increasing worker order
  on every device, so blocking send/receive cannot deadlock.

`check_bipartition` adds rules B1–B4 to `check.check_schedule` (see its docstring).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

from hppctl.models.plan import HppPlan
from hppctl.models.schedule import Action, Schedule, ScheduleStage
from hppctl.planner.cost import CostModel

WEIGHT_KINDS = ("SW", "RW")


def is_bipartition(stages) -> bool:
    return any(getattr(s, "backward_layers", None) is not None for s in stages)


def ranges(stages) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(forward range, backward range) of every stage."""
    return [(tuple(s.layers), tuple(s.backward_layers or s.layers)) for s in stages]


def add_split_actions(schedule: Schedule, plan: HppPlan) -> Schedule:
    """The plan's 1F1B schedule (from `generate`) with backward ranges and SX/RX/SW/RW added."""
    stages = [ScheduleStage(**{**st.model_dump(), "backward_layers": ps.backward_layers})
              for st, ps in zip(schedule.stages, plan.stages)]
    device = [s.devices[0] for s in stages]
    actions = {d: list(a) for d, a in schedule.actions.items()}
    for w, (f, b) in enumerate(ranges(stages)):
        if w == 0:
            continue
        if b[0] < f[0] and b[0] > 0:
            _after_each(actions[device[w - 1]], "SA", device[w], "SX")
            _after_each(actions[device[w]], "RA", device[w - 1], "RX")
    for w, (f, b) in enumerate(ranges(stages)):
        if w == 0 or f[0] == b[0]:
            continue
        # [b_w, f_w): backwarded by w, forwarded by w-1; [f_w, b_w): backwarded by w-1, forwarded by w
        owner, user = (w, w - 1) if b[0] < f[0] else (w - 1, w)
        actions[device[owner]].append(Action(kind="SW", stage=owner, peer=device[user]))
        actions[device[user]].append(Action(kind="RW", stage=user, peer=device[owner]))
    return Schedule(**{**schedule.model_dump(exclude={"stages", "actions"}), "stages": stages, "actions": actions})


def _after_each(actions: list[Action], kind: str, peer: str, new_kind: str) -> None:
    """Insert `new_kind` right after every `kind` action with `peer`, same micro-batch and samples."""
    out = []
    for a in actions:
        out.append(a)
        if a.kind == kind and a.peer == peer:
            out.append(Action(kind=new_kind, stage=a.stage, micro_batch=a.micro_batch, start=a.start, end=a.end,
                              peer=peer))
    actions[:] = out


def without_weight_transfers(actions: list[Action]) -> list[Action]:
    """What the generic rules see: SW/RW come after STEP by design and are checked by rule B4."""
    return [a for a in actions if a.kind not in WEIGHT_KINDS]


# --- rules B1-B4 ---------------------------------------------------------------------------------

def check_bipartition(schedule: Schedule, add: Callable) -> None:
    """B1 stages are single devices whose ranges are contiguous, ordered and interleaved (split layers
    between neighbours); B2 exactly the SX/RX/SW/RW the ranges need; B3 an SX after the forward that
    produces it, its RX before the backward that uses it; B4 SW/RW after STEP."""
    split_actions = any(a.kind in ("SX", "RX", *WEIGHT_KINDS) for acts in schedule.actions.values() for a in acts)
    if not is_bipartition(schedule.stages) and not split_actions:
        return
    if not _check_ranges(schedule, add):
        return
    expected, actual = _expected_split_actions(schedule), Counter()
    for d, acts in schedule.actions.items():
        for a in acts:
            if a.kind in ("SX", "RX", *WEIGHT_KINDS):
                actual[(d, a.kind, a.peer, a.micro_batch)] += 1
    for key in sorted(expected - actual, key=str):
        add(key[0], None, None, f"missing {key[1]} with {key[2]} (micro-batch {key[3]}) for a split block")
    for key in sorted(actual - expected, key=str):
        add(key[0], None, None, f"{key[1]} with {key[2]} (micro-batch {key[3]}) matches no split block")
    for d, acts in schedule.actions.items():
        _check_order(d, acts, add)


def _check_ranges(schedule: Schedule, add) -> bool:
    ok = True
    L = schedule.stages[-1].layers[1]
    expected = (0, 0)
    for p, ((f, b), st) in enumerate(zip([(f, b) for f, b in ranges(schedule.stages)], schedule.stages)):
        device = st.devices[0]
        if len(st.devices) != 1:
            add(device, None, None, f"stage {p}: a Bi-Partition stage is one device, found {len(st.devices)}")
            ok = False
        if (f[0], b[0]) != expected:
            add(device, None, None, f"stage {p}: ranges start at {f[0]}/{b[0]}, expected {expected[0]}/{expected[1]}")
            ok = False
        if p + 1 < len(schedule.stages) and max(f[0], b[0]) > min(f[1], b[1]):
            add(device, None, None, f"stage {p}: forward [{f[0]}, {f[1]}) and backward [{b[0]}, {b[1]}) do not "
                                    f"interleave with the neighbours' (split layers must lie between neighbours)")
            ok = False
        expected = (f[1], b[1])
    if expected != (L, L):
        add(schedule.stages[-1].devices[0], None, None, f"ranges end at {expected}, not at layer {L}")
        ok = False
    return ok


def _expected_split_actions(schedule: Schedule) -> Counter:
    expected: Counter = Counter()
    device = [s.devices[0] for s in schedule.stages]
    for w, (f, b) in enumerate(ranges(schedule.stages)):
        if w == 0:
            continue
        if 0 < b[0] < f[0]:
            for m in range(schedule.num_micro_batches):
                expected[(device[w - 1], "SX", device[w], m)] += 1
                expected[(device[w], "RX", device[w - 1], m)] += 1
        if f[0] != b[0]:
            owner, user = (w, w - 1) if b[0] < f[0] else (w - 1, w)
            expected[(device[owner], "SW", device[user], None)] += 1
            expected[(device[user], "RW", device[owner], None)] += 1
    return expected


def _check_order(device: str, actions: list[Action], add) -> None:
    forwarded: set[int] = set()
    received: set[int] = set()
    stepped = False
    for i, a in enumerate(actions):
        if a.kind == "F":
            forwarded.add(a.micro_batch)
        elif a.kind == "SX" and a.micro_batch not in forwarded:
            add(device, i, a, "sends a split block's input before the forward that produces it")
        elif a.kind == "RX":
            received.add(a.micro_batch)
        elif a.kind == "B" and _needs_input(actions) and a.micro_batch not in received:
            add(device, i, a, "backward before the split block's input is received (RX)")
        elif a.kind == "STEP":
            stepped = True
        elif a.kind in WEIGHT_KINDS and not stepped:
            add(device, i, a, "weights move before STEP (they must be the round's new weights)")
        if stepped and a.kind not in ("STEP", *WEIGHT_KINDS):
            add(device, i, a, "only weight transfers may follow STEP")


def _needs_input(actions: list[Action]) -> bool:
    return any(a.kind == "RX" for a in actions)


# --- timings ---------------------------------------------------------------------------------------

def recompute_s(cm: CostModel, device: int, forward: tuple[int, int], backward: tuple[int, int], samples: float) -> float:
    """Forward time of the backward range's layers outside the forward range (re-run by the backward)."""
    (i1, j1), (i2, j2) = forward, backward
    total = 0.0
    if i2 < i1:
        total += cm.forward_time(device, i2, min(i1, j2), samples)
    if j2 > j1:
        total += cm.forward_time(device, max(j1, i2), j2, samples)
    return total


def message_bytes(cm: CostModel, a: Action, forward: tuple[int, int], backward: tuple[int, int]) -> int:
    """Bytes of one Bi-Partition message of the upstream worker of a pair (forward/backward: its ranges)."""
    L = cm.num_layers

    def at(cut: int) -> int:
        return 0 if cut in (0, L) else a.samples * cm.boundary[cut - 1]

    if a.kind in ("SA", "RA"):
        return at(forward[1])
    if a.kind in ("SG", "RG", "SX", "RX"):
        return at(backward[1])
    lo, hi = sorted((forward[1], backward[1]))
    return cm.param_bytes(lo, hi)


def stage_memory(cm: CostModel, device: int, forward: tuple[int, int], backward: tuple[int, int]) -> tuple[int, int]:
    """(fixed bytes, bytes per in-flight sample) of a Bi-Partition worker, the planner's memory model
    (`planner.bipartition.worker_memory`) split the way the simulator counts memory."""
    import dataclasses

    from hppctl.planner.bipartition import costs_from_model, worker_memory

    costs = costs_from_model(cm, [device])
    (i1, j1), (i2, j2) = forward, backward
    fixed = worker_memory(dataclasses.replace(costs, warmup=(0,)), 0, i1, j1, i2, j2)
    one = worker_memory(dataclasses.replace(costs, warmup=(1,)), 0, i1, j1, i2, j2)
    return int(fixed), int((one - fixed) // cm.B)
