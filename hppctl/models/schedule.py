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
| `2I0[0:48]`         | I      | split backward, input half: gradients of the stage's inputs only        |
| `2W0[0:48]`         | W      | split backward, weight half: the deferred weight gradients of mb 2      |
| `2SA0>tx1[0:16]`    | SA     | send activations of samples [0, 16) to device tx1 of stage p+1          |
| `2RA1<nx0[0:16]`    | RA     | receive activations of samples [0, 16) from device nx0 of stage p-1     |
| `2SG1>nx0[0:16]`    | SG     | send input gradients of samples [0, 16) back to nx0 of stage p-1        |
| `2RG0<tx1[0:16]`    | RG     | receive gradients of samples [0, 16) from tx1 of stage p+1              |
| `AR0`               | AR     | AllReduce of stage 0's accumulated weight gradients over its group      |
| `STEP0`             | STEP   | optimizer step of stage 0's weights                                     |
| `2SX0>tx1[0:16]`    | SX     | Bi-Partition: send the input of a split block to its backward owner      |
| `2RX1<nx0[0:16]`    | RX     | Bi-Partition: receive it (the backward recomputes the block from it)     |
| `SW1>nx0`           | SW     | Bi-Partition: send split layers' updated weights to their forward owner  |
| `RW0<tx1`           | RW     | Bi-Partition: receive them (before the next round's first forward)      |
| `2F0[0:48]@3`       | F, B   | the same, run with weight version 3 (asynchronous schedules, see below) |

Split backward (zero-bubble schedules, `HppPlan.split_backward`; docs/schedule.md). Pairing
contract: a device back-propagates each micro-batch either with one `B`, or with one `I` and, later
on the same device, one `W` of the same micro-batch and range; everything downstream of the
backward (the `SG` of the input gradients) needs only the `I`, and the `W` must come before the
stage's `AR` and `STEP`, which are the first readers of the weight gradients. Until its `W` runs,
a micro-batch keeps everything its forward saved plus the gradients `I` captured for the weights
(20-58 % more than its activations: docs/runtime.md), so a generator bounds how many wait
(`ScheduleStage.in_flight_cap`) and places each to fill time the device would otherwise wait.

Asynchronous schedules (`nf1b`, `pipedream`; `hppctl.schedule.nf1b`) set `micro_batches_per_update`:
one window (an epoch) of mini-batches without a flush, a STEP after every mini-batch's backwards,
and a weight version tag on every F and B (version u = the weights after u STEPs of the stage).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, PlainSerializer, model_validator

from hppctl.models.base import FrozenModel, duplicates, listed
from hppctl.models.cluster import DeviceName
from hppctl.models.profile import _OmitsUnset

NonNegInt = Annotated[int, Field(ge=0)]
PosInt = Annotated[int, Field(gt=0)]

ActionKind = Literal["F", "B", "I", "W", "SA", "RA", "SG", "RG", "AR", "STEP", "SX", "RX", "SW", "RW"]
COMPUTE_KINDS = ("F", "B", "I", "W")
BACKWARD_KINDS = ("B", "I")
"""The kinds that consume a micro-batch's received gradients (RG) and produce its input gradients (SG)."""
SEND_KINDS = ("SA", "SG", "SX")
RECV_KINDS = ("RA", "RG", "RX")
TRANSFER_KINDS = SEND_KINDS + RECV_KINDS
WEIGHT_KINDS = ("SW", "RW")
"""Bi-Partition: once per round, after STEP; a peer and no micro-batch."""

_COMPUTE = re.compile(r"^(\d+)(F|B|I|W)(\d+)\[(\d+):(\d+)\](?:@(\d+))?$")
_TRANSFER = re.compile(r"^(\d+)(SA|RA|SG|RG|SX|RX)(\d+)([<>])([A-Za-z0-9][A-Za-z0-9_.-]*)\[(\d+):(\d+)\]$")
_GROUP = re.compile(r"^(AR|STEP)(\d+)$")
_WEIGHTS = re.compile(r"^(SW|RW)(\d+)([<>])([A-Za-z0-9][A-Za-z0-9_.-]*)$")
_EXAMPLES = "e.g. 2F0[0:48], 2B0[0:48]@1, 2I0[0:48], 2W0[0:48], 2SA0>tx1[0:16], 2RA1<nx0[0:16], AR0, STEP0"


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
    version: NonNegInt | None = None
    """F and B of asynchronous schedules: the weight version (STEPs of the stage) the pass runs with."""

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
        if self.version is not None and self.kind not in ("F", "B"):
            raise ValueError(f"{self.kind} takes no weight version (asynchronous schedules do not split backwards)")
        peered = self.kind in TRANSFER_KINDS or self.kind in WEIGHT_KINDS
        if peered != (self.peer is not None):
            raise ValueError(f"{self.kind}: a peer device is {'required' if peered else 'not allowed'}")
        return self

    def __str__(self) -> str:
        if self.kind in COMPUTE_KINDS:
            tagged = "" if self.version is None else f"@{self.version}"
            return f"{self.micro_batch}{self.kind}{self.stage}[{self.start}:{self.end}]{tagged}"
        if self.kind in TRANSFER_KINDS:
            arrow = ">" if self.kind in SEND_KINDS else "<"
            return f"{self.micro_batch}{self.kind}{self.stage}{arrow}{self.peer}[{self.start}:{self.end}]"
        if self.kind in WEIGHT_KINDS:
            return f"{self.kind}{self.stage}{'>' if self.kind == 'SW' else '<'}{self.peer}"
        return f"{self.kind}{self.stage}"

    @classmethod
    def from_str(cls, text: str) -> "Action":
        """Parse the text form; raises ValueError naming the text and the expected shapes."""
        text = text.strip()
        if m := _COMPUTE.match(text):
            mb, kind, stage, start, end, version = m.groups()
            return cls(kind=kind, stage=int(stage), micro_batch=int(mb), start=int(start), end=int(end),
                       version=None if version is None else int(version))
        if m := _TRANSFER.match(text):
            mb, kind, stage, arrow, peer, start, end = m.groups()
            if arrow != (">" if kind in SEND_KINDS else "<"):
                raise ValueError(f"action {text!r}: {kind} takes {'>' if kind in SEND_KINDS else '<'} before the peer")
            return cls(kind=kind, stage=int(stage), micro_batch=int(mb), start=int(start), end=int(end), peer=peer)
        if m := _GROUP.match(text):
            return cls(kind=m.group(1), stage=int(m.group(2)))
        if m := _WEIGHTS.match(text):
            kind, stage, arrow, peer = m.groups()
            if arrow != (">" if kind == "SW" else "<"):
                raise ValueError(f"action {text!r}: {kind} takes {'>' if kind == 'SW' else '<'} before the peer")
            return cls(kind=kind, stage=int(stage), peer=peer)
        raise ValueError(f"not an action: {text!r} ({_EXAMPLES})")

    @property
    def samples(self) -> int:
        return (self.end or 0) - (self.start or 0)


def _parse_text(value: object) -> object:
    return Action.from_str(value) if isinstance(value, str) else value


ActionText = Annotated[Action, BeforeValidator(_parse_text), PlainSerializer(str, return_type=str)]
"""An Action that files store as its text form."""


class ScheduleStage(_OmitsUnset):
    """A stage as the schedule sees it: its layers, its device group and each device's samples."""

    _omit_when_default = ("backward_layers", "in_flight_cap")

    layers: Annotated[list[NonNegInt], Field(min_length=2, max_length=2)]
    """Half-open layer range [start, end) (of the forwards when `backward_layers` is set)."""
    devices: Annotated[list[DeviceName], Field(min_length=1)]
    samples: Annotated[list[NonNegInt], Field(min_length=1)]
    """Samples of every micro-batch per device; devices own consecutive index ranges in listed order."""
    warmup: PosInt
    """K_p: forwards before strict one-forward-one-backward (M for GPipe)."""
    backward_layers: Annotated[list[NonNegInt], Field(min_length=2, max_length=2)] | None = None
    """Bi-Partition: the layers this stage backwards, when they differ from `layers`."""
    in_flight_cap: PosInt | None = None
    """Split backwards: most micro-batches forwarded and not yet through their `W` (None: K_p)."""

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
    micro_batches_per_update: PosInt | None = None
    """Asynchronous schedules only: N micro-batches make one mini-batch, one STEP each (None: one
    synchronous round, a single STEP at the end)."""
    in_flight_cap: PosInt | None = None
    """Asynchronous schedules only: most mini-batches the head stage has started and not yet stepped."""
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
        twice = duplicates(seen)
        if twice:
            raise ValueError(f"a device appears in more than one stage: {listed(twice)}")
        if set(self.actions) != set(seen):
            missing, extra = sorted(set(seen) - set(self.actions)), sorted(set(self.actions) - set(seen))
            raise ValueError(f"actions must list exactly the stages' devices (missing {missing}, unknown {extra})")
        return self
