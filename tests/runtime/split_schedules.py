"""Split-backward versions of generated schedules, for runtime tests (the lead's generator makes its own).

`split_backwards` replaces each `B` by an `I` and puts its `W` later on the same device, a move the
pairing contract allows (models/schedule.py): right before the device's next `F` ("before next F"),
or all together before the stage's `AR` / `STEP` ("before AR")."""

from __future__ import annotations

from hppctl.models.schedule import Action, Schedule

PLACEMENTS = ("before next F", "before AR")


def split_backwards(schedule: Schedule, placement: str) -> Schedule:
    if placement not in PLACEMENTS:
        raise ValueError(f"placement {placement!r} is not one of {PLACEMENTS}")
    actions = {}
    for device, listed in schedule.actions.items():
        out: list[Action] = []
        deferred: list[Action] = []
        for a in listed:
            if a.kind in ("AR", "STEP") or (placement == "before next F" and a.kind == "F"):
                out += [half(b, "W") for b in deferred]
                deferred = []
            if a.kind == "B":
                out.append(half(a, "I"))
                deferred.append(a)
            else:
                out.append(a)
        out += [half(b, "W") for b in deferred]
        actions[device] = out
    return Schedule(**{**schedule.model_dump(), "actions": actions})


def half(b: Action, kind: str) -> Action:
    return Action(kind=kind, stage=b.stage, micro_batch=b.micro_batch, start=b.start, end=b.end)
