"""Coordinator state as data: `apply(state, event) -> state` is the only way it changes.

Pure (no clocks, sockets or processes), so every failure story is a list of events in a test.
The loop that owns clocks, sockets and re-planning side effects feeds events in.

The state keeps only its last LOG_WINDOW events (`log`): a heartbeat is an event, and copying an
ever longer log on each one made a long run's coordinator quadratic (issue 23: 20k heartbeats took
2.1 s at the start, 19 s once the log held 60k events). Every event the loop applies also goes to
its sink as it is applied (runtime/ft_session.py: `on_state`, written to `--metrics`), so none is lost
to the window; `applied` counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Literal

from hppctl.models.events import Event, Heartbeat, Lost, ProbeAnswered, Replanned, Suspected

Health = Literal["alive", "suspect", "lost"]

LOG_WINDOW = 512
"""Events the state keeps (the newest); applying one costs O(LOG_WINDOW) however long the run."""


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
    """The last LOG_WINDOW events, oldest first."""
    applied: int = 0
    """Events applied since the start (the log holds the last of them)."""

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
    return CoordinatorState(devices, completed, (state.log + (event,))[-LOG_WINDOW:], state.applied + 1)


def apply_all(state: CoordinatorState, events, sink: Callable[[Event], None] | None = None) -> CoordinatorState:
    """`apply` each event in order, handing it to `sink` once applied (the loop streams them to
    `--metrics`: the state's own log keeps only the last LOG_WINDOW)."""
    for event in events:
        state = apply(state, event)
        if sink is not None:
            sink(event)
    return state


def find_suspects(state: CoordinatorState, now_s: float, timeout_s: float) -> list[Suspected]:
    """Devices alive but silent for more than `timeout_s` (the clock is the caller's)."""
    return [Suspected(device=d.name, at_s=now_s, silent_s=now_s - d.last_heartbeat_s)
            for d in state.devices.values() if d.health == "alive" and now_s - d.last_heartbeat_s > timeout_s]
