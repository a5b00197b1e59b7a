"""Failure detection of a fault-tolerant run, on the coordinator's side (docs/fault-tolerance.md,
"Detection"): the heartbeat listener, the coordinator's state (ft/state.py), suspicion and
probes, and the count of refused datagrams.

    detector = FaultDetector(timeout_s=3.0, probe_s=2.0, emit=session_event)
    detector.listen(host, token, addresses)          # before the workers start: they beat from the join on
    detector.arm(devices)                            # every worker trains: silence counts from now
    losses = detector.detect(lost)                   # each pass: beats read, the silent suspected, probes settled

`FtSession` (runtime/ft_session.py) owns one and decides what a loss means (re-plan, replay);
the detector only says who is alive. Every run event it produces goes through `emit(kind, **fields)`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from hppctl.ft.state import CoordinatorState, apply_all, find_suspects
from hppctl.models.events import (Armed, DeviceAnswered, DeviceSuspected, Dropped, Event, Heartbeat, ProbeAnswered,
                                  Suspected)
from hppctl.runtime.heartbeat import HeartbeatListener, probe

DROPPED_EVENT_EVERY_S = 10.0
"""At most one "dropped" event per this many seconds, with the count since the last one: a flood of
garbage on the heartbeat port must not grow `--metrics`, the `--json` summary or memory."""
DROPPED_SAMPLES = 3
"""How many distinct reasons a "dropped" event quotes (each cut to heartbeat.MAX_REASON_CHARS)."""


@dataclass(frozen=True)
class Loss:
    """A device confirmed lost: it left on purpose (`leaving`: it still runs and hands its layers over),
    or crashed, hung or dropped off the network."""

    device: str
    reason: str
    leaving: bool = False


class FaultDetector:
    """Who is alive, from heartbeats and probes; silent devices become suspect, unanswered probes losses."""

    def __init__(self, *, timeout_s: float, probe_s: float, emit: Callable[..., object]) -> None:
        self.timeout_s, self.probe_s, self.emit = timeout_s, probe_s, emit
        self.listener: HeartbeatListener | None = None
        self.state: CoordinatorState | None = None
        """None until `arm`: a slow start-up is not a failure."""
        self.on_state: Callable[[Event], None] | None = None
        """Every event the state applies (heartbeats included), as it is applied."""
        self.t0 = time.monotonic()
        self.probes: dict[str, list] = {}
        """Per suspect, its probe's result once the probe thread has one."""
        self.probe_ports: dict[str, tuple[str, int]] = {}
        self.leaver_heard: dict[str, float] = {}
        """When each device that left was last heard from (its beats say `leave` until it has gone)."""
        self.dropped_seen, self.dropped_logged_at = 0, float("-inf")

    def listen(self, host: str, token: str, addresses: dict[str, set[str]], port: int = 0) -> None:
        self.listener = HeartbeatListener(host, token, addresses, port=port).start()

    def stop(self) -> None:
        """Whatever drops are left become a last event; the listener closes."""
        if self.listener is not None:
            self.log_dropped(final=True)
            self.listener.stop()

    def clock(self) -> float:
        """Detection's clock: seconds since it armed."""
        return time.monotonic() - self.t0

    def arm(self, devices: list[str]) -> None:
        """Start detection: every worker has built its stage and joined (silence counts from now)."""
        self.t0 = time.monotonic()
        self.state = CoordinatorState.start(devices, now_s=0.0)
        self.listener.drain()
        self.emit(Armed, devices=devices)

    def apply(self, event: Event) -> None:
        self.state = apply_all(self.state, (event,), self.on_state)

    def alive(self, device: str) -> bool:
        return self.state.devices[device].health == "alive"

    def probe_address(self, device: str) -> tuple[str, int] | None:
        """Where the coordinator would probe `device` (the port its beats announce); None until heard."""
        address, port = self.probe_ports.get(device, (None, 0))
        return (address, port) if port else None

    def announce(self, generation: int) -> None:
        """Every survivor learns the new generation now rather than in its next acknowledgement."""
        self.listener.generation = generation
        self.listener.announce()

    def suspect(self, device: str, silent_s: float, why: str) -> None:
        """`device` is suspect: probe it over its own connection, on a thread (`detect` settles it)."""
        self.apply(Suspected(device=device, at_s=self.clock(), silent_s=silent_s))
        self.emit(DeviceSuspected, device=device, silent_s=round(silent_s, 3), why=why)
        result: list = []
        address, port = self.probe_ports.get(device, (None, None))

        def run_probe() -> None:
            result.append(bool(port) and probe(address, port, self.listener.token, device, self.probe_s))

        threading.Thread(target=run_probe, daemon=True, name=f"probe-{device}").start()
        self.probes[device] = result

    def detect(self, lost: list[str]) -> list[Loss]:
        """Read the beats, suspect the silent, settle the probes: the devices confirmed lost since last
        time (`lost`: those lost before, whose beats no longer count)."""
        losses: dict[str, Loss] = {}
        for beat in self.listener.drain():
            if beat.device in self.leaver_heard:
                self.leaver_heard[beat.device] = self.clock()
            if beat.device in lost or beat.device in losses:
                continue
            message = beat.message
            self.probe_ports[beat.device] = (beat.address, message.probe_port)
            if message.kind == "leave":
                losses[beat.device] = Loss(beat.device, "left", leaving=True)
                continue
            self.apply(Heartbeat(device=beat.device, at_s=self.clock(), round=message.round,
                                 samples_per_s=message.samples_per_s))
        for suspect in find_suspects(self.state, self.clock(), self.timeout_s):
            self.suspect(suspect.device, suspect.silent_s, why=f"silent for {suspect.silent_s:.1f} s")
        for device, result in list(self.probes.items()):
            if not result:
                continue
            del self.probes[device]
            if result[0] or self.alive(device):  # answered, or a beat arrived while the probe ran
                self.apply(ProbeAnswered(device=device, at_s=self.clock()))
                self.emit(DeviceAnswered, device=device)
            elif device not in losses:
                losses[device] = Loss(device, "probe unanswered")
        return list(losses.values())

    def log_dropped(self, *, final: bool = False) -> None:
        """Datagrams the listener refused (wrong or missing token, unknown device or address, replays)
        become one "dropped" event per DROPPED_EVENT_EVERY_S at most: how many since the last one, the
        total, and a few sample reasons. `final`: whatever is left, now (the run is ending)."""
        dropped, now = self.listener.dropped, time.monotonic()
        fields = dropped_event(dropped.count, self.dropped_seen, dropped.recent(after=self.dropped_seen),
                               since_last_s=now - self.dropped_logged_at, final=final)
        if fields is not None:
            self.emit(Dropped, **fields)
            self.dropped_seen, self.dropped_logged_at = fields["total"], now


def dropped_event(total: int, seen: int, reasons: list[str], *, since_last_s: float, final: bool = False) -> dict | None:
    """The fields of the next "dropped" event, or None when none is due: drops counted past `seen`,
    and DROPPED_EVENT_EVERY_S gone by since the last event (or the run is ending: `final`).
    `reasons`: the latest reasons of those drops; the event quotes the first DROPPED_SAMPLES distinct."""
    if total <= seen or (not final and since_last_s < DROPPED_EVENT_EVERY_S):
        return None
    samples = list(dict.fromkeys(reasons))[:DROPPED_SAMPLES]
    return {"count": total - seen, "total": total, "why": samples[0] if samples else "", "samples": samples}

