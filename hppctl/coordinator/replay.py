"""PURE decisions of a pipeline replay: where training restarts and where every layer's state comes from.

- `resume_round`: the newest round every old stage can restore — a surviving device's own snapshot,
  or, for a stage whose only device was lost, its backup holder's copy (notes/asteroid.md §5: roll
  every stage back to the same round, so nothing is applied twice and no sample is skipped) — and
  whose rounds every device has reported (so that the run's metrics have a row for every round).
- `transfer_plan`: the re-planner's migrations with their actual senders (a lost device's layers come
  from its backup holder, or from the device itself when it leaves on purpose).
- `upload_plan`: heavy re-planning's gather step, one sender per old stage.
"""

from __future__ import annotations

from hppctl.errors import RuntimeFailure
from hppctl.planner.replan import Migration, backup_targets


def resume_round(stages: list[list[str]], lost: str, inventories: dict[str, dict], *, leaving: bool = False,
                 reported: int | None = None) -> int:
    """`inventories[device]` = {"snapshots": [rounds], "backups": {device: [rounds]}} of every reporter.

    `reported`: how many rounds every old device has reported to the coordinator. A worker snapshots a
    round before it reports it, so the newest snapshot can be a round the coordinator never heard of;
    resuming there would skip that round's report. Rounds past `reported` are not candidates."""
    candidates: set[int] | None = None
    for inventory in inventories.values():
        rounds = set(inventory["snapshots"])
        candidates = rounds if candidates is None else candidates & rounds
    lost_stage = next(devices for devices in stages if lost in devices)
    if not leaving and not [d for d in lost_stage if d != lost]:
        held = set()
        for inventory in inventories.values():
            held |= set(inventory["backups"].get(lost, []))
        candidates = held if candidates is None else candidates & held
    if reported is not None and candidates is not None:
        candidates = {r for r in candidates if r <= reported}
    if not candidates:
        raise RuntimeFailure(f"after losing {lost}: no round that every stage can restore "
                             f"(snapshots and backups: {inventories})")
    return max(candidates)


def transfer_plan(old_plan, migrations: list[Migration], lost: str, *, leaving: bool = False) -> list[dict]:
    """Each migration as {device, start, end, source, backup_of}: who actually sends the layers."""
    holder = backup_targets(old_plan).get(lost)
    out = []
    for m in migrations:
        if m.source is not None:
            out.append({"device": m.device, "start": m.start, "end": m.end, "source": m.source, "backup_of": None})
        elif leaving:
            out.append({"device": m.device, "start": m.start, "end": m.end, "source": lost, "backup_of": None})
        elif holder is not None:
            out.append({"device": m.device, "start": m.start, "end": m.end, "source": holder, "backup_of": lost})
        else:
            raise RuntimeFailure(f"layers [{m.start}, {m.end}) were held only by {lost}, which had no backup")
    return out


def upload_plan(old_plan, lost: str, *, leaving: bool = False) -> dict[str, dict]:
    """Heavy: for every old stage, the device that sends its state to the coordinator."""
    holder = backup_targets(old_plan).get(lost)
    uploads = {}
    for p, stage in enumerate(old_plan.stages):
        alive = [d for d in stage.devices if d != lost]
        if alive:
            uploads[str(p)] = {"device": alive[0], "backup_of": None}
        elif leaving:
            uploads[str(p)] = {"device": lost, "backup_of": None}
        elif holder is not None:
            uploads[str(p)] = {"device": holder, "backup_of": lost}
        else:
            raise RuntimeFailure(f"stage {p} was held only by {lost}, which had no backup")
    return uploads
