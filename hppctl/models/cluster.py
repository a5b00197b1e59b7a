"""The cluster inventory (`cluster.yaml`): what the user owns and how to reach it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from hppctl.limits import MAX_DEVICES, MAX_TEXT_CHARS
from hppctl.models.base import FrozenModel, duplicates, listed
from hppctl.models.units import Bytes, BytesPerSecond

DeviceName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
"""A device's name: letters, digits, '_', '.', '-' (it appears in file names and process titles)."""

Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
"""A host, user, command or path: bounded, because the errors that name it quote it whole."""


class DeviceSpec(FrozenModel):
    """One device. Exactly one of `preset` (a modelled device), `host` (SSH) or `local` is given."""

    name: DeviceName
    preset: Text | None = None
    """Device model from published specifications (`jetson-nano`, …); no connection is made."""
    host: Text | None = None
    """Address or ~/.ssh/config alias of a real device reached over SSH."""
    user: Text | None = None
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    local: bool = False
    """A worker process on this machine."""
    memory: Bytes | None = None
    """Memory budget for training on this device; defaults to the preset's or the measured memory."""
    python: Text | None = None
    """Python interpreter on the device (default: `python3`)."""
    accelerator: Literal["cpu", "cuda", "auto"] = "cpu"
    """What the device computes on: `cpu`, `cuda` (its first CUDA GPU; the run fails on the device,
    naming it, when torch sees none there), or `auto` (CUDA when `torch.cuda.is_available()` on the
    device, else the CPU). Resolved by the worker on the device (runtime/accelerator.py)."""

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> "DeviceSpec":
        kinds = [k for k, on in (("preset", self.preset is not None), ("host", self.host is not None),
                                 ("local", self.local)) if on]
        if len(kinds) != 1:
            raise ValueError(f"device {self.name!r} needs exactly one of preset, host, local (got {kinds or 'none'})")
        return self


class LinkSpec(FrozenModel):
    """A per-pair override of the default bandwidth (symmetric)."""

    between: Annotated[list[DeviceName], Field(min_length=2, max_length=2)]
    bandwidth: BytesPerSecond


class SshSpec(FrozenModel):
    """How to reach `host` devices. Host-key checking always stays on."""

    known_hosts: Text | None = None
    """known_hosts file to trust (default: the user's own)."""
    identity_file: Text | None = None
    connect_timeout_s: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] = 10.0
    """Seconds to wait for an SSH connection (at most an hour; `.inf` was an OverflowError)."""


class ClusterSpec(FrozenModel):
    """The cluster inventory. Format documented in docs/formats.md."""

    format_version: Literal[1] = 1
    name: DeviceName
    bandwidth: BytesPerSecond = 12.5e6
    """Default device-to-device bandwidth (100mbit if unset)."""
    devices: Annotated[list[DeviceSpec], Field(min_length=1, max_length=MAX_DEVICES)]
    links: list[LinkSpec] = []
    ssh: SshSpec = SshSpec()

    @model_validator(mode="after")
    def _names_are_unique_and_links_known(self) -> "ClusterSpec":
        dupes = duplicates(d.name for d in self.devices)
        if dupes:
            raise ValueError(f"duplicate device names: {listed(dupes)}")
        names = {d.name for d in self.devices}
        for link in self.links:
            for end in link.between:
                if end not in names:
                    raise ValueError(f"link names unknown device {end!r}")
            if link.between[0] == link.between[1]:
                raise ValueError(f"link joins {link.between[0]!r} to itself")
        return self

    def device(self, name: str) -> DeviceSpec:
        for d in self.devices:
            if d.name == name:
                return d
        raise KeyError(name)

    def bandwidth_between(self, a: str, b: str) -> float:
        """Bytes/s between two devices: the last matching override, else the default."""
        rate = self.bandwidth
        for link in self.links:
            if set(link.between) == {a, b}:
                rate = link.bandwidth
        return rate
