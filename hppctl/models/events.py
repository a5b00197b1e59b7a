"""Coordinator events: the only way coordinator state changes (see hppctl/coordinator/state.py)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field

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
