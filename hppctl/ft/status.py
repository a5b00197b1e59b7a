"""PURE: the coordinator's live status table (device, stage, health, last heartbeat, round, throughput)."""

from __future__ import annotations

from hppctl.ft.state import CoordinatorState

COLUMNS = ("device", "stage", "health", "last heartbeat", "round", "samples/s")


def status_rows(state: CoordinatorState, stage_of: dict[str, int], now_s: float) -> list[dict]:
    """One row per device the coordinator knows, in stage order; `now_s` on the state's clock."""
    rows = []
    for d in sorted(state.devices.values(), key=lambda d: (stage_of.get(d.name, 1 << 30), d.name)):
        rows.append({"device": d.name, "stage": stage_of.get(d.name), "health": d.health,
                     "last_heartbeat_s": round(max(0.0, now_s - d.last_heartbeat_s), 1),
                     "round": d.round, "samples_per_s": round(d.samples_per_s, 1)})
    return rows


def render_rows(rows: list[dict]) -> list[list[str]]:
    """Cells for a text table, in COLUMNS order."""
    return [[r["device"], "-" if r["stage"] is None else str(r["stage"]), r["health"],
             f"{r['last_heartbeat_s']:.1f} s ago", str(r["round"]), f"{r['samples_per_s']:.1f}"] for r in rows]
