"""Events, typed: the coordinator's (the only way its state changes, see hppctl/ft/state.py)
and a fault-tolerant run's (`RunEvent`, the `--metrics` event lines; runtime/ft_session.py produces them)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, TypeAdapter

from hppctl.models.base import FrozenModel
from hppctl.models.cluster import DeviceName

NonNegFloat = Annotated[float, Field(ge=0)]
NonNegInt = Annotated[int, Field(ge=0)]


class Heartbeat(FrozenModel):
    kind: Literal["heartbeat"] = "heartbeat"
    device: DeviceName
    at_s: NonNegFloat
    round: NonNegInt = 0
    samples_per_s: NonNegFloat = 0.0


class Suspected(FrozenModel):
    """No heartbeat for longer than the timeout: a probe decides."""

    kind: Literal["suspected"] = "suspected"
    device: DeviceName
    at_s: NonNegFloat
    silent_s: NonNegFloat


class ProbeAnswered(FrozenModel):
    kind: Literal["probe-answered"] = "probe-answered"
    device: DeviceName
    at_s: NonNegFloat


class Lost(FrozenModel):
    """Confirmed failure (probe unanswered) or a device that left on purpose."""

    kind: Literal["lost"] = "lost"
    device: DeviceName
    at_s: NonNegFloat
    reason: str


class Replanned(FrozenModel):
    kind: Literal["replanned"] = "replanned"
    at_s: NonNegFloat
    method: Literal["light", "heavy"]
    devices: list[DeviceName]
    resume_round: NonNegInt


Event = Annotated[Union[Heartbeat, Suspected, ProbeAnswered, Lost, Replanned], Field(discriminator="kind")]


def state_line(event: Event) -> dict[str, Any]:
    """The `--metrics` line of a coordinator event (the state's full log, streamed: it keeps only the
    last ones): `{"event": "state", "kind": …, …}`, apart from the run events below by its `event`."""
    return {"event": "state", **event.model_dump(mode="json")}


# --- run events: what a fault-tolerant run reports (`--metrics`/`--events` lines, `--json` summary) ---
#
# One record per kind, discriminated by its `event` field. `at` is wall time (time.time()), `generation`
# the layout generation the event happened in. The JSON of a record is the `--metrics` line
# (docs/formats.md), field for field and in this order: `event`, `at`, `generation`, then the kind's
# own fields. Unlike the coordinator events above (monotonic `at_s`, internal to the coordinator's
# state), these leave the process.

class RunEventBase(FrozenModel):
    event: str
    """The kind; each record narrows it to its literal (declared here first, so it leads the line)."""
    at: float
    generation: NonNegInt

    def wire(self) -> dict[str, Any]:
        """The `--metrics` line of this event, as a dict (json.dumps of it is the line)."""
        return self.model_dump(mode="json")


class Armed(RunEventBase):
    """Every worker built its stage and joined: failure detection starts."""

    event: Literal["armed"] = "armed"
    devices: list[DeviceName]


class Dropped(RunEventBase):
    """Heartbeat datagrams the listener refused since the last such event (at most one per interval)."""

    event: Literal["dropped"] = "dropped"
    count: NonNegInt
    total: NonNegInt
    why: str
    samples: list[str]


class DeviceSuspected(RunEventBase):
    event: Literal["suspected"] = "suspected"
    device: DeviceName
    silent_s: NonNegFloat
    why: str


class DeviceAnswered(RunEventBase):
    """A suspect answered the probe: alive after all."""

    event: Literal["probe-answered"] = "probe-answered"
    device: DeviceName


class DeviceLost(RunEventBase):
    event: Literal["lost"] = "lost"
    device: DeviceName
    reason: str


class RunReplanned(RunEventBase):
    event: Literal["replanned"] = "replanned"
    method: Literal["light", "heavy"]
    requested: str
    """The --replan asked for (`method` is what ran)."""
    lost: list[DeviceName]
    resume_round: NonNegInt
    replan_s: NonNegFloat
    devices: list[DeviceName]
    stages: list[dict[str, Any]]
    """Per stage of the new plan: layers, devices, samples."""
    moved_bytes: NonNegInt
    gathered_bytes: NonNegInt
    layout: NonNegInt
    """The generation of the layout the state was rebuilt from."""
    split_backward: bool = False
    """Whether the new plan defers its weight gradients (`I`/`W`), as a split-backward run's re-plan does."""
    split_dropped: str = ""
    """Why a split-backward run's new plan runs whole backwards ("" otherwise: planner/replan.py)."""


class RunResumed(RunEventBase):
    """The first round after a re-plan completed."""

    event: Literal["resumed"] = "resumed"
    round: NonNegInt
    recovery_s: float
    phases: dict[str, float]
    """Per step of the reconfiguration, the slowest device's seconds."""


class DevicesLate(RunEventBase):
    """Devices that had not said done when the run ended (they are stopped)."""

    event: Literal["late"] = "late"
    devices: list[DeviceName]


RunEvent = Annotated[Union[Armed, Dropped, DeviceSuspected, DeviceAnswered, DeviceLost, RunReplanned, RunResumed,
                           DevicesLate], Field(discriminator="event")]
RUN_EVENT = TypeAdapter(RunEvent)


def run_event(line: dict[str, Any]) -> RunEvent:
    """The typed record of a `--metrics` event line (BadInput-free: a malformed line is a bug here)."""
    return RUN_EVENT.validate_python(line, strict=False)
