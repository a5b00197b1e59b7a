"""PURE decisions of a pipeline replay: where training restarts and where every layer's state comes from.

- `resume_round`: the newest round every old stage can restore — a surviving device's own snapshot,
  or, for a stage whose only device was lost, its backup holder's copy (notes/asteroid.md §5: roll
  every stage back to the same round, so nothing is applied twice and no sample is skipped) — and
  whose rounds every device has reported (so that the run's metrics have a row for every round).
- `transfer_plan`: the re-planner's migrations with their actual senders (a lost device's layers come
  from its backup holder, or from the device itself when it leaves on purpose).
- `upload_plan`: heavy re-planning's gather step, one sender per old stage.
- `migration_bytes`: the bytes of state a light re-plan's transfers send.
- `stage_sources`: behind all three, who can send each old stage's state, or why nobody can.
- `common_layout`: which layout the survivors can replay from, when a device was lost while they
  were moving to a new one (some still on the old layout, some on the new).

`lost` is every device the re-plan drops, one or several lost together; `leavers` are those of them
that left on purpose (they are still running and send their own state). A stage can be restored
only if a device of it survives, or it had one device and that device's backup holder survives:
losing a stage's device together with its backup holder, or every replica of a stage, loses layers,
and the run fails naming them (its checkpoint directory still allows `--resume`).
"""

from __future__ import annotations

from collections.abc import Collection

from hppctl.errors import RuntimeFailure
from hppctl.models.ft_documents import Transfer, Upload
from hppctl.models.reports import Inventory
from hppctl.planner.replan import Migration, backup_ring, lost_devices


def common_layout(inventories: dict[str, Inventory], current: int,
                  previous: int | None) -> tuple[int, dict[str, Inventory]] | None:
    """The layout every reporter can restore from, with each reporter's inventory in it; None if none.

    A reporter's inventory is of the layout it trains on (`layout`, the generation that made it), with
    what it still keeps of the layout before (`previous`) until its first round in the new one. The
    current layout wins when every reporter is on it; else the previous one, when every reporter
    still holds it (a device lost while the survivors were moving to the current layout)."""
    for layout in (current, previous):
        if layout is None:
            continue
        chosen = {device: _inventory_in(inventory, layout) for device, inventory in inventories.items()}
        if all(inventory is not None for inventory in chosen.values()):
            return layout, chosen
    return None


def _inventory_in(inventory: Inventory, layout: int) -> Inventory | None:
    for candidate in (inventory, inventory.previous):
        if candidate is not None and candidate.layout == layout:
            return candidate
    return None


def resume_round(stages: list[list[str]], lost: str | Collection[str], inventories: dict[str, Inventory], *,
                 leavers: Collection[str] = (), reported: int | None = None) -> int:
    """`inventories[device]`: every reporter's snapshots and backups (their rounds).

    `reported`: how many rounds every old device has reported to the coordinator. A worker snapshots a
    round before it reports it, so the newest snapshot can be a round the coordinator never heard of;
    resuming there would skip that round's report. Rounds past `reported` are not candidates."""
    lost = lost_devices(lost)
    candidates: set[int] | None = None
    for inventory in inventories.values():
        rounds = set(inventory.snapshots)
        candidates = rounds if candidates is None else candidates & rounds
    for _, backup_of in stage_sources(stages, lost, leavers):
        if backup_of is None:
            continue
        held = set()
        for inventory in inventories.values():
            held |= set(inventory.backups.get(backup_of, []))
        candidates = held if candidates is None else candidates & held
    if reported is not None and candidates is not None:
        candidates = {r for r in candidates if r <= reported}
    if not candidates:
        raise RuntimeFailure(f"after losing {', '.join(lost)}: no round that every stage can restore "
                             f"(snapshots and backups: {inventories})")
    return max(candidates)


def stage_sources(stages: list[list[str]], lost: str | Collection[str],
                  leavers: Collection[str] = ()) -> list[tuple[str, str | None]]:
    """Per old stage, who can send its state: (a device of it that still runs — one that stays before
    one that leaves —, None), or for a single-device stage whose device is gone (its backup holder,
    that device). A RuntimeFailure names the layers that are gone with it otherwise."""
    gone = set(lost_devices(lost)) - set(leavers)
    ring = backup_ring(stages)
    sources: list[tuple[str, str | None]] = []
    for p, devices in enumerate(stages):
        running = sorted((d for d in devices if d not in gone), key=lambda d: d in leavers)
        if running:
            sources.append((running[0], None))
            continue
        if len(devices) > 1:
            raise RuntimeFailure(f"stage {p} lost every replica ({', '.join(devices)}): replicas keep no "
                                 f"backups, so its layers are gone")
        owner, holder = devices[0], ring[devices[0]]
        if holder is None:
            raise RuntimeFailure(f"stage {p}'s layers were held only by {owner}, which had no backup")
        if holder in gone:
            raise RuntimeFailure(f"stage {p}'s layers were held only by {owner}, whose backup holder {holder} "
                                 f"was lost too")
        sources.append((holder, owner))
    return sources


def transfer_plan(old_plan, migrations: list[Migration], lost: str | Collection[str], *,
                  leavers: Collection[str] = ()) -> list[Transfer]:
    """Each migration as a `Transfer` (models/ft_documents.py): who actually sends the layers."""
    sources = stage_sources(_devices(old_plan), lost, leavers)
    out = []
    for m in migrations:
        if m.source is not None:
            source, backup_of = m.source, None
        else:  # every device of the old stage holding them is lost: whoever can send that stage's state
            source, backup_of = sources[next(p for p, s in enumerate(old_plan.stages) if s.start <= m.start < s.end)]
        out.append(Transfer(device=m.device, start=m.start, end=m.end, source=source, backup_of=backup_of))
    return out


def migration_bytes(migrations: list[Transfer], inventories: dict[str, Inventory], resume: int, names_of) -> int:
    """Bytes of state the transfers of `transfer_plan` send: each migration between two devices carries
    its layers' tensors (parameters, buffers, optimizer state) as its sender holds them at the resume
    round — its own snapshot, or its backup of `backup_of` — sizes from the senders' inventories
    (`state_bytes`). A backup holder taking over the lost layers itself sends nothing: it received
    them before the failure, as backups (counted in the rounds' `backup_bytes`).
    `names_of(start, end)`: the state names of layers [start, end)."""
    total = 0
    for m in migrations:
        if m.source == m.device:
            continue
        held = inventories[m.source].state_bytes
        sizes = (held.backups.get(m.backup_of, {}) if m.backup_of else held.own).get(str(resume))
        if sizes is None:  # a report that does not cover the resume round: one line
            what = f"its backup of {m.backup_of}" if m.backup_of else "its own state"
            raise RuntimeFailure(f"{m.source}'s stall report gives no sizes of {what} at round {resume}: refused")
        total += sum(sizes.get(name, 0) for name in names_of(m.start, m.end))
    return total


def upload_plan(old_plan, lost: str | Collection[str], *, leavers: Collection[str] = ()) -> dict[str, Upload]:
    """Heavy: for every old stage, the device that sends its state to the coordinator."""
    return {str(p): Upload(device=source, backup_of=backup_of)
            for p, (source, backup_of) in enumerate(stage_sources(_devices(old_plan), lost, leavers))}


def _devices(plan) -> list[list[str]]:
    return [list(s.devices) for s in plan.stages]
