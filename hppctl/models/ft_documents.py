"""The fault-tolerance documents the coordinator sends its workers through the run's store
(`runtime/wire.py`: `gather/<generation>`, `reconf/<generation>`): typed and versioned, so that both
ends read the same fields and a worker of another build refuses a document it does not know
instead of reading a missing key mid-recovery."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hppctl.models.base import FrozenModel
from hppctl.models.cluster import DeviceName
from hppctl.models.plan import HppPlan
from hppctl.models.schedule import Schedule

FT_DOCUMENT_VERSION = 1


class Transfer(FrozenModel):
    """Light re-planning: layers [start, end) go from `source` to `device`; `backup_of` names the lost
    device whose backup the source sends (None: the source's own state)."""
    device: DeviceName
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    source: DeviceName
    backup_of: DeviceName | None = None


class Upload(FrozenModel):
    """Heavy re-planning: the device that uploads an old stage's state (its own, or its backup of `backup_of`)."""
    device: DeviceName
    backup_of: DeviceName | None = None


class GatherPlan(FrozenModel):
    """`gather/<generation>`: every old stage's state to the coordinator, as held at `resume_round` in
    layout `layout`; `uploads` by old stage index (a string: JSON object keys)."""
    version: Literal[1] = FT_DOCUMENT_VERSION
    resume_round: int = Field(ge=0)
    layout: int = Field(ge=0)
    uploads: dict[str, Upload]


class Reconfiguration(FrozenModel):
    """`reconf/<generation>`: the new plan and schedule, the resume round, the layout whose state it
    starts from, and where that state comes from (light: `migrations`, and the leavers among their
    sources as `helpers`; heavy: the stages the coordinator re-cut, under `heavy_new` keys), with the
    bytes the re-plan moves (`moved_bytes`; heavy also `gathered_bytes`, the upload)."""
    version: Literal[1] = FT_DOCUMENT_VERSION
    resume_round: int = Field(ge=0)
    layout: int = Field(ge=0)
    lost: list[DeviceName]
    method: Literal["light", "heavy"]
    plan: HppPlan
    schedule: Schedule
    moved_bytes: int = Field(ge=0)
    gathered_bytes: int = Field(default=0, ge=0)
    migrations: list[Transfer] = []
    helpers: list[DeviceName] = []
