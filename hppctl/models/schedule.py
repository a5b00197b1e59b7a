"""A schedule: the ordered actions every device executes in one HPP round.

The runtime interprets it, the simulator replays it, and `hppctl.schedule.check` validates it.
Every action has a short text form that parses back (`Action.from_str(str(a)) == a`); a schedule
file stores each device's actions as these strings. Sample ranges are half-open `[start:end)`
over the global sample indices 0..B-1 of one micro-batch. The stage number in an action is always
the stage of the device that executes it.

| text                | kind   | meaning (on a device of stage p)                                        |
|---------------------|--------|-------------------------------------------------------------------------|
| `2F0[0:48]`         | F      | forward of micro-batch 2, stage 0, samples [0, 48)                      |
| `2B0[0:48]`         | B      | backward of micro-batch 2, stage 0, samples [0, 48)                     |
| `2SA0>tx1[0:16]`    | SA     | send activations of samples [0, 16) to device tx1 of stage p+1          |
| `2RA1<nx0[0:16]`    | RA     | receive activations of samples [0, 16) from device nx0 of stage p-1     |
| `2SG1>nx0[0:16]`    | SG     | send input gradients of samples [0, 16) back to nx0 of stage p-1        |
| `2RG0<tx1[0:16]`    | RG     | receive gradients of samples [0, 16) from tx1 of stage p+1              |
| `AR0`               | AR     | AllReduce of stage 0's accumulated weight gradients over its group      |
| `STEP0`             | STEP   | optimizer step of stage 0's weights                                     |
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, PlainSerializer, model_validator

from hppctl.models.base import FrozenModel
from hppctl.models.cluster import DeviceName

NonNegInt = Annotated[int, Field(ge=0)]
PosInt = Annotated[int, Field(gt=0)]

ActionKind = Literal["F", "B", "SA", "RA", "SG", "RG", "AR", "STEP"]
COMPUTE_KINDS = ("F", "B")
SEND_KINDS = ("SA", "SG")
RECV_KINDS = ("RA", "RG")
TRANSFER_KINDS = SEND_KINDS + RECV_KINDS

_COMPUTE = re.compile(r"^(\d+)(F|B)(\d+)\[(\d+):(\d+)\]$")
_TRANSFER = re.compile(r"^(\d+)(SA|RA|SG|RG)(\d+)([<>])([A-Za-z0-9][A-Za-z0-9_.-]*)\[(\d+):(\d+)\]$")
_GROUP = re.compile(r"^(AR|STEP)(\d+)$")
_EXAMPLES = "e.g. 2F0[0:48], 2B0[0:48], 2SA0>tx1[0:16], 2RA1<nx0[0:16], AR0, STEP0"


class Action(FrozenModel):
    """One step of one device's program. Which fields are set depends on `kind` (see module docstring)."""

    kind: ActionKind
    stage: NonNegInt
    micro_batch: NonNegInt | None = None
    start: NonNegInt | None = None
    """First sample index of the half-open range [start, end) (F, B and transfers)."""
    end: NonNegInt | None = None
    peer: DeviceName | None = None
    """The other end of a transfer: destination of SA/SG, source of RA/RG."""

    @model_validator(mode="after")
    def _fields_for_kind(self) -> "Action":
        ranged = self.kind in COMPUTE_KINDS or self.kind in TRANSFER_KINDS
        if ranged:
            if self.micro_batch is None or self.start is None or self.end is None:
                raise ValueError(f"{self.kind} needs micro_batch, start and end")
            if self.end <= self.start:
                raise ValueError(f"{self.kind}: sample range [{self.start}:{self.end}) is empty")
        elif (self.micro_batch, self.start, self.end) != (None, None, None):
            raise ValueError(f"{self.kind} takes no micro_batch or sample range")
        if (self.kind in TRANSFER_KINDS) != (self.peer is not None):
            raise ValueError(f"{self.kind}: a peer device is {'required' if self.kind in TRANSFER_KINDS else 'not allowed'}")
        return self

    def __str__(self) -> str:
        if self.kind in COMPUTE_KINDS:
            return f"{self.micro_batch}{self.kind}{self.stage}[{self.start}:{self.end}]"
        if self.kind in TRANSFER_KINDS:
            arrow = ">" if self.kind in SEND_KINDS else "<"
            return f"{self.micro_batch}{self.kind}{self.stage}{arrow}{self.peer}[{self.start}:{self.end}]"
        return f"{self.kind}{self.stage}"

    @classmethod
    def from_str(cls, text: str) -> "Action":
        """Parse the text form; raises ValueError naming the text and the expected shapes."""
        text = text.strip()
        if m := _COMPUTE.match(text):
            mb, kind, stage, start, end = m.groups()
            return cls(kind=kind, stage=int(stage), micro_batch=int(mb), start=int(start), end=int(end))
        if m := _TRANSFER.match(text):
            mb, kind, stage, arrow, peer, start, end = m.groups()
            if arrow != (">" if kind in SEND_KINDS else "<"):
                raise ValueError(f"action {text!r}: {kind} takes {'>' if kind in SEND_KINDS else '<'} before the peer")
            return cls(kind=kind, stage=int(stage), micro_batch=int(mb), start=int(start), end=int(end), peer=peer)
        if m := _GROUP.match(text):
            return cls(kind=m.group(1), stage=int(m.group(2)))
        raise ValueError(f"not an action: {text!r} ({_EXAMPLES})")

    @property
    def samples(self) -> int:
        return (self.end or 0) - (self.start or 0)


def _parse_text(value: object) -> object:
    return Action.from_str(value) if isinstance(value, str) else value


ActionText = Annotated[Action, BeforeValidator(_parse_text), PlainSerializer(str, return_type=str)]
"""An Action that files store as its text form."""


class ScheduleStage(FrozenModel):
    """A stage as the schedule sees it: its layers, its device group and each device's samples."""

    layers: Annotated[list[NonNegInt], Field(min_length=2, max_length=2)]
    """Half-open layer range [start, end)."""
    devices: Annotated[list[DeviceName], Field(min_length=1)]
    samples: Annotated[list[NonNegInt], Field(min_length=1)]
    """Samples of every micro-batch per device; devices own consecutive index ranges in listed order."""
    warmup: PosInt
    """K_p: forwards before strict one-forward-one-backward (M for GPipe)."""

    @model_validator(mode="after")
    def _aligned(self) -> "ScheduleStage":
        if len(self.samples) != len(self.devices):
            raise ValueError(f"samples has {len(self.samples)} entries for {len(self.devices)} devices")
        return self


class Schedule(FrozenModel):
    """One HPP round of actions for every device (see the module docstring and docs/schedule.md)."""

    format_version: Literal[1] = 1
    kind: Literal["schedule"] = "schedule"
    policy: str
    """How it was generated: `1f1b-asteroid`, `1f1b`, `gpipe`, `warmup:K0,K1,…` or `custom`."""
    model: str = ""
    profile_digest: str = ""
    """Copied from the plan the schedule was generated from ('' if none)."""
    micro_batch: PosInt
    num_micro_batches: PosInt
    stages: Annotated[list[ScheduleStage], Field(min_length=1)]
    actions: dict[DeviceName, list[ActionText]]
    """Per device, in the order the device executes them."""

    @model_validator(mode="after")
    def _consistent(self) -> "Schedule":
        seen: list[str] = []
        for p, stage in enumerate(self.stages):
            if sum(stage.samples) != self.micro_batch:
                raise ValueError(f"stage {p} assigns {sum(stage.samples)} samples per micro-batch, "
                                 f"micro_batch is {self.micro_batch}")
            seen += stage.devices
        if len(set(seen)) != len(seen):
            raise ValueError(f"a device appears in more than one stage: {sorted({d for d in seen if seen.count(d) > 1})}")
        if set(self.actions) != set(seen):
            missing, extra = sorted(set(seen) - set(self.actions)), sorted(set(self.actions) - set(seen))
            raise ValueError(f"actions must list exactly the stages' devices (missing {missing}, unknown {extra})")
        return self
