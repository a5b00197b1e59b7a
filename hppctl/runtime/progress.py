"""Progress of a run's long phases: bounded step reports from workers, and plain timestamped log lines.

Workers (a training window, Galaxy's passes) report how far they are in the round they are running
through one store key per device, `progress/<device>`, overwritten at most every `every` seconds (and
at a round's last step): no key per micro-batch, whatever the run's length. The launcher reads those
keys at the same pace and shows the slowest device's figure.

`ProgressLog` writes what a log file or CI needs when stderr is not a terminal (`--log-every`): one
line at each phase's start and end, and one line per interval in between with the phase's latest
status, each prefixed by an ISO-8601 UTC timestamp:

    2026-11-26T03:01:10Z training: started (40 rounds)
    2026-11-26T03:01:12Z round 12/40 loss 1.2340 31.0 samples/s
    2026-11-26T03:02:40Z training: done in 90.1 s
    2026-11-26T03:02:40Z test pass: started (9 batches)
    2026-11-26T03:02:42Z test pass 3/9 batches
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterable

from hppctl.runtime import wire

REPORT_EVERY_S = 0.5
"""Default pace of the workers' step reports and of the launcher's reads of them."""


@dataclass(frozen=True)
class StepProgress:
    """How far one device is in the round (a training round or window, or Galaxy's passes) it runs."""

    round: int
    done: int
    total: int
    unit: str
    """What a step is: "micro-batches" (training) or "passes" (inference)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> "StepProgress":
        doc = json.loads(text)
        return cls(int(doc["round"]), int(doc["done"]), int(doc["total"]), str(doc["unit"]))

    def step_name(self) -> str:
        """One step: "micro-batch", "pass"."""
        return {"micro-batches": "micro-batch", "passes": "pass"}.get(self.unit, self.unit)

    def position(self) -> float:
        """Rounds done, fractional: round 2 with 30 of 120 steps done is 2.25."""
        return self.round + (self.done / self.total if self.total else 0.0)


class Throttle:
    """`due()` is True at most once per `every` seconds of `clock` (the first call always)."""

    def __init__(self, every: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.clock = every, clock
        self.last: float | None = None

    def due(self) -> bool:
        now = self.clock()
        if self.last is not None and now - self.last < self.every:
            return False
        self.last = now
        return True


class StepReporter:
    """A worker's side: `report(round, done, total)` overwrites its store key when due, and at a
    round's last step (so the launcher never shows a finished round as unfinished). The first
    report comes `every` seconds after the reporter is made: a fast round writes only its last."""

    def __init__(self, store, device: str, unit: str, every: float = REPORT_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.key, self.unit = store, wire.progress(device), unit
        self.throttle = Throttle(every, clock)
        self.throttle.last = clock()

    def report(self, round_index: int, done: int, total: int) -> None:
        if self.throttle.due() or done == total:
            self.store.set(self.key, StepProgress(round_index, done, total, self.unit).to_json())


def read_steps(store, devices: Iterable[str]) -> dict[str, StepProgress]:
    """The devices' latest step reports (those that wrote one)."""
    found = {}
    for device in devices:
        key = wire.progress(device)
        if store.check([key]):
            found[device] = StepProgress.from_json(store.get(key))
    return found


def slowest(steps: dict[str, StepProgress], current_round: int) -> StepProgress | None:
    """The least advanced report of the round `current_round`: a device's report of an earlier,
    finished round says nothing about this one (it has not written its first of this round yet)."""
    now = [s for s in steps.values() if s.round >= current_round]
    if len(now) < len(steps) or not now:
        return None
    return min(now, key=StepProgress.position)


def utc_stamp(t: float) -> str:
    """ISO-8601 UTC to the second: 2026-11-26T03:01:12Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def log_line(t: float, text: str) -> str:
    return f"{utc_stamp(t)} {text}"


class ProgressLog:
    """Plain progress lines (module docstring): `begin(phase)`, `update(status)` as the phase goes,
    `end()`. An interval line repeats the latest status (or the phase's elapsed time) even when
    nothing changed: in a log, a line every interval is the sign the run is alive. `poll()` writes
    it when due; `running()` calls poll from a thread, so a phase that blocks the caller (a long
    test pass batch, a model build) still gets its lines."""

    def __init__(self, write: Callable[[str], None], every: float, clock: Callable[[], float] = time.time) -> None:
        self.write, self.every, self.clock = write, every, clock
        self.phase: str | None = None
        self.status: str | None = None
        self.started = self.last = 0.0
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self, phase: str, detail: str = "") -> None:
        with self.lock:
            if self.phase is not None:
                self.end()
            self.phase, self.status, self.started = phase, None, self.clock()
            self._emit(f"{phase}: started" + (f" ({detail})" if detail else ""))

    def update(self, status: str) -> None:
        with self.lock:
            self.status = status
            self._poll()

    def event(self, text: str) -> None:
        """A line now (a worker joined, a fault), whatever the interval."""
        with self.lock:
            self._emit(text)

    def end(self, detail: str = "", failed: bool = False) -> None:
        with self.lock:
            if self.phase is None:
                return
            took = self.clock() - self.started
            self._emit(f"{self.phase}: {'stopped after' if failed else 'done in'} {took:.1f} s"
                       + (f", {detail}" if detail else ""))
            self.phase = self.status = None

    def poll(self) -> None:
        with self.lock:
            self._poll()

    def _poll(self) -> None:
        now = self.clock()
        if self.phase is None or now - self.last < self.every:
            return
        self._emit(self.status or f"{self.phase}: running for {now - self.started:.1f} s")

    def _emit(self, text: str) -> None:
        self.last = self.clock()
        self.write(log_line(self.last, text))

    # --- the interval thread ----------------------------------------------------------------------
    def __enter__(self) -> "ProgressLog":
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="progress-log", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.end(failed=exc[0] is not None)

    def _beat(self) -> None:
        while not self._stop.wait(min(self.every / 4, 0.5)):
            self.poll()


def report_every(log_every: float | None) -> float:
    """The workers' report pace for a log interval: as often as the log writes, at most every 0.5 s
    (0.5 s is already finer than a person reads a bar)."""
    return min(REPORT_EVERY_S, log_every) if log_every else REPORT_EVERY_S
