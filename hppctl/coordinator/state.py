"""Coordinator state as data: `apply(state, event) -> state` is the only way it changes.

Pure (no clocks, sockets or processes), so every failure story is a list of events in a test.
The loop that owns clocks, sockets and re-planning side effects feeds events in.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from hppctl.models.events import Event, Heartbeat, Lost, ProbeAnswered, Replanned, Suspected

Health = Literal["alive", "suspect", "lost"]


@dataclass(frozen=True)
class DeviceState:
    name: str
    health: Health = "alive"
    last_heartbeat_s: float = 0.0
    round: int = 0
    samples_per_s: float = 0.0


@dataclass(frozen=True)
class CoordinatorState:
    devices: dict[str, DeviceState]
    completed_round: int = 0
    """The last round every live device has reported finishing: where a replay restarts."""
    log: tuple[Event, ...] = field(default_factory=tuple)

    @classmethod
    def start(cls, devices: list[str], now_s: float = 0.0) -> "CoordinatorState":
        return cls({d: DeviceState(d, last_heartbeat_s=now_s) for d in devices})

    def live(self) -> list[str]:
        return [d.name for d in self.devices.values() if d.health != "lost"]


def apply(state: CoordinatorState, event: Event) -> CoordinatorState:
    """The next state. Events about unknown or already-lost devices change nothing but the log."""
    device = state.devices.get(getattr(event, "device", ""), None)
    devices = dict(state.devices)
    if isinstance(event, Heartbeat) and device and device.health != "lost":
        devices[device.name] = replace(device, health="alive", last_heartbeat_s=max(device.last_heartbeat_s, event.at_s),
                                       round=max(device.round, event.round), samples_per_s=event.samples_per_s)
    elif isinstance(event, ProbeAnswered) and device and device.health == "suspect":
        devices[device.name] = replace(device, health="alive", last_heartbeat_s=event.at_s)
    elif isinstance(event, Suspected) and device and device.health == "alive":
        devices[device.name] = replace(device, health="suspect")
    elif isinstance(event, Lost) and device:
        devices[device.name] = replace(device, health="lost")
    elif isinstance(event, Replanned):
        devices = {name: d for name, d in devices.items() if name in event.devices}
    live_rounds = [d.round for d in devices.values() if d.health != "lost"]
    completed = min(live_rounds) if live_rounds else state.completed_round
    if isinstance(event, Replanned):
        completed = event.resume_round
    return CoordinatorState(devices, completed, state.log + (event,))


def find_suspects(state: CoordinatorState, now_s: float, timeout_s: float) -> list[Suspected]:
    """Devices alive but silent for more than `timeout_s` (the clock is the caller's)."""
    return [Suspected(device=d.name, at_s=now_s, silent_s=now_s - d.last_heartbeat_s)
            for d in state.devices.values() if d.health == "alive" and now_s - d.last_heartbeat_s > timeout_s]
