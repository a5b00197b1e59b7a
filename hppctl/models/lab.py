"""The edge-lab spec (`hppctl lab up --spec L.yaml`) and the lab's state record.

A spec names hosts like a cluster file names devices, but says how to *emulate* each one: a CPU
quota (fraction of a core), a memory limit, the bandwidth of its egress, and optional delay and
loss. A preset (`jetson-nano`, ...) fills in CPU and memory from hppctl/lab/presets.py; explicit
values win over the preset's.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from hppctl.errors import shorten
from hppctl.limits import MAX_DEVICES
from hppctl.models.base import FrozenModel, duplicates, listed
from hppctl.models.lab_presets import CFS_PERIOD_US, PRESETS
from hppctl.models.units import Bytes, BytesPerSecond, Seconds

Percent = Annotated[float, Field(ge=0, le=100)]
LabName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")]
"""Short enough for namespace and cgroup names; no dots (they would read as file extensions)."""
HostName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")]
"""Also the host's hostname inside the lab (its UTS namespace), so no dots."""

DEFAULT_SUBNET = "10.213.0.0/24"
_PRIVATE = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")]


def _known_presets() -> list[str]:
    return sorted(PRESETS)


class LabHost(FrozenModel):
    """One emulated device."""

    name: HostName
    preset: str | None = None
    cpu: Annotated[float, Field(gt=0, le=1024, allow_inf_nan=False)] | None = None
    """CPU quota in cores (0.25 = a quarter of one core)."""
    memory: Bytes | None = None
    """Memory limit (the kernel kills the biggest process of the host beyond it)."""
    bandwidth: BytesPerSecond | None = None
    """Rate of the host's egress (default: the lab's `bandwidth`)."""
    delay: Seconds | None = None
    """One-way delay added to every packet the host receives (default: the lab's `delay`)."""
    loss: Percent | None = None
    """Percentage of packets the host receives that are dropped (default: the lab's `loss`)."""

    @field_validator("preset")
    @classmethod
    def _preset_is_known(cls, value: str | None) -> str | None:
        if value is not None and value not in _known_presets():
            raise ValueError(f"unknown preset {shorten(repr(value))} (known: {', '.join(_known_presets())})")
        return value

    @model_validator(mode="after")
    def _preset_or_limits(self) -> "LabHost":
        if self.preset is None and (self.cpu is None or self.memory is None):
            raise ValueError(f"host {self.name!r} needs a preset, or both cpu and memory")
        return self


class LabLink(FrozenModel):
    """A per-pair override (symmetric): both directions between the two hosts get these values."""

    between: Annotated[list[HostName], Field(min_length=2, max_length=2)]
    bandwidth: BytesPerSecond | None = None
    delay: Seconds | None = None
    """One-way delay in each direction (round trip = 2 x delay)."""
    loss: Percent | None = None

    @model_validator(mode="after")
    def _says_something(self) -> "LabLink":
        if self.bandwidth is None and self.delay is None and self.loss is None:
            raise ValueError(f"link {self.between} sets none of bandwidth, delay, loss")
        return self


class LabSpec(FrozenModel):
    """An emulated edge cluster. Format documented in docs/lab.md."""

    format_version: Literal[1] = 1
    name: LabName
    bandwidth: BytesPerSecond = 12.5e6
    """Default egress rate of every host (100mbit if unset)."""
    delay: Seconds = 0.0
    loss: Percent = 0.0
    subnet: str = DEFAULT_SUBNET
    """Private IPv4 subnet of the lab: .1 is this machine's side of the lab bridge, hosts follow."""
    hosts: Annotated[list[LabHost], Field(min_length=1, max_length=MAX_DEVICES)]
    links: list[LabLink] = []
    memory_scale: Annotated[float, Field(gt=0, le=1)] = 0.25
    """Presets' memory is multiplied by this so that a lab fits in this machine's RAM."""
    fastest_cpu: Annotated[float, Field(gt=0, le=1024, allow_inf_nan=False)] = 1.0
    """Cores given to the fastest preset; the others get their FLOP/s ratio of it (capped at nproc)."""
    delay_backend: Literal["auto", "netem", "nfqueue"] = "auto"
    """How delay and loss are emulated: tc netem, or an NFQUEUE delay line where netem is missing."""
    cpu_period: Annotated[Seconds, Field(ge=0.001, le=1.0)] = CFS_PERIOD_US / 1e6
    """CFS period of every host's CPU quota (the kernel allows 1 ms to 1 s): docs/lab.md, Presets."""

    @field_validator("subnet")
    @classmethod
    def _private_subnet(cls, value: str) -> str:
        try:
            net = ipaddress.IPv4Network(value, strict=True)
        except ValueError as e:
            raise ValueError(f"not an IPv4 subnet like '10.213.0.0/24': {e}") from None
        if not any(net.subnet_of(p) for p in _PRIVATE):
            raise ValueError(f"subnet {value} is not private (use 10/8, 172.16/12 or 192.168/16)")
        if net.prefixlen > 29:
            raise ValueError(f"subnet {value} is too small (prefix at most /29)")
        return value

    @model_validator(mode="after")
    def _names_unique_links_known_and_room(self) -> "LabSpec":
        dupes = duplicates(h.name for h in self.hosts)
        if dupes:
            raise ValueError(f"duplicate host names: {listed(dupes)}")
        names = {h.name for h in self.hosts}
        for link in self.links:
            for end in link.between:
                if end not in names:
                    raise ValueError(f"link names unknown host {end!r}")
            if link.between[0] == link.between[1]:
                raise ValueError(f"link joins {link.between[0]!r} to itself")
        usable = ipaddress.IPv4Network(self.subnet).num_addresses - 3  # network, broadcast, bridge
        if len(self.hosts) > usable:
            raise ValueError(f"subnet {self.subnet} has room for {usable} hosts, spec has {len(self.hosts)}")
        return self


# --- what `lab up` created, so that `lab down` can remove exactly that --------------------------


class HostState(FrozenModel):
    name: str
    address: str
    netns: str
    veth: str
    """This machine's end of the host's veth pair (the other end is `eth0` inside `netns`)."""
    preset: str | None = None
    cpu: float
    memory_bytes: int
    bandwidth_bytes_per_s: float
    delay_s: float = 0.0
    loss_percent: float = 0.0
    cgroups: list[str] = []
    """Absolute cgroup directories (one per controller on v1, one on v2)."""
    sshd_pid: int | None = None
    delayline_pid: int | None = None


class LabState(FrozenModel):
    """Written to `<state dir>/state.json` step by step while `up` runs, read by `status` and `down`."""

    format_version: Literal[1] = 1
    name: str
    tag: str
    """Six hex digits in every interface name of this lab (interface names are limited to 15 bytes)."""
    state_dir: str
    subnet: str
    bridge: str | None = None
    bridge_address: str | None = None
    cgroup_version: int | None = None
    cgroup_lab_dirs: list[str] = []
    delay_backend: str | None = None
    firewall: str | None = None
    """The iptables command used for the delay line's NFQUEUE rules (nfqueue backend only)."""
    hosts: list[HostState] = []
    cluster_file: str | None = None
    known_hosts: str | None = None
    identity_file: str | None = None
    complete: bool = False
    """True once `up` finished; a state left False is a crashed `up` that `down` cleans up."""
