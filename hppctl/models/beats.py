"""The heartbeat protocol's messages (runtime/heartbeat.py: signed JSON datagrams between a worker
and the coordinator), typed: the coordinator reads a beat's fields as the types it uses them as, so a
signed beat of another build — a round as a string, a negative sequence number, an infinite rate,
a port past 65535, a boolean for a number — is refused as malformed (and counted) instead of ending
its loop (issue 23)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from hppctl.models.base import FrozenModel
from hppctl.models.events import NonNegInt


class HeartbeatMessage(FrozenModel):
    """A worker's heartbeat (`leave`: it is leaving on purpose, SIGTERM), numbered from 1 per worker."""

    kind: Literal["heartbeat", "leave"]
    device: str
    seq: NonNegInt = 0
    generation: NonNegInt = 0
    """The layout generation the worker runs in."""
    round: NonNegInt = 0
    """Rounds completed (the status table)."""
    samples_per_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    probe_port: Annotated[int, Field(ge=0, le=65535)] = 0
    """Where the worker answers probes (0: not yet)."""


class Ack(FrozenModel):
    """The coordinator's answer to a beat (`seq`; 0 for an announcement): its generation."""

    kind: Literal["ack"] = "ack"
    generation: NonNegInt
    seq: NonNegInt = 0
