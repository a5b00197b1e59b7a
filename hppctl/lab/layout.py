"""PURE: from a lab spec to names, addresses, limits, shaping rules and the cluster file.

Nothing here touches the system, so every decision `lab up` makes can be unit-tested without
root: which address each host gets, what each interface and namespace is called, each host's
CPU quota and memory limit, the rate of every directed pair, the delay and loss on every packet a
host receives, and the `cluster.yaml` that describes the result.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass, field

from hppctl.errors import BadInput
from hppctl.lab.presets import preset_cpu, preset_memory
from hppctl.models.cluster import ClusterSpec
from hppctl.models.lab import LabSpec

NETNS_PREFIX = "hppctl-lab-"
CGROUP_PREFIX = "hppctl-lab-"
LINK_PATTERN = re.compile(r"^hp[bvp][0-9a-f]{6}(-[0-9]+)?$")
"""Every interface a lab creates: hpb<tag> (bridge), hpv<tag>-<i> (veth), hpp<tag>-<i> (peer, briefly)."""


def lab_tag(name: str) -> str:
    """Six hex digits derived from the lab name: interface names are limited to 15 bytes."""
    return hashlib.sha256(name.encode()).hexdigest()[:6]


def bridge_name(tag: str) -> str:
    return f"hpb{tag}"


def veth_name(tag: str, index: int) -> str:
    return f"hpv{tag}-{index}"


def peer_name(tag: str, index: int) -> str:
    return f"hpp{tag}-{index}"


def netns_name(lab: str, host: str) -> str:
    return f"{NETNS_PREFIX}{lab}-{host}"


def cgroup_lab_dir_name(lab: str) -> str:
    return f"{CGROUP_PREFIX}{lab}"


@dataclass(frozen=True)
class Impairment:
    delay_s: float = 0.0
    loss_percent: float = 0.0

    @property
    def is_none(self) -> bool:
        return self.delay_s == 0 and self.loss_percent == 0


@dataclass(frozen=True)
class HostPlan:
    index: int
    name: str
    address: str
    preset: str | None
    cpu: float
    memory_bytes: int
    bandwidth_bytes_per_s: float
    delay_s: float
    loss_percent: float


@dataclass(frozen=True)
class LabPlan:
    spec: LabSpec
    tag: str
    bridge: str
    bridge_address: str
    prefixlen: int
    hosts: list[HostPlan] = field(default_factory=list)

    def host(self, name: str) -> HostPlan:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def rate(self, src: str, dst: str) -> float:
        """Bytes/s of traffic from `src` to `dst`: the last link override with a bandwidth, else src's egress."""
        rate = self.host(src).bandwidth_bytes_per_s
        for link in self.spec.links:
            if set(link.between) == {src, dst} and link.bandwidth is not None:
                rate = link.bandwidth
        return rate

    def impairment(self, src: str | None, dst: str) -> Impairment:
        """Delay and loss on packets from `src` (None: this machine) arriving at `dst`."""
        host = self.host(dst)
        delay, loss = host.delay_s, host.loss_percent
        for link in self.spec.links:
            if src is not None and set(link.between) == {src, dst}:
                delay = link.delay if link.delay is not None else delay
                loss = link.loss if link.loss is not None else loss
        return Impairment(delay, loss)

    def egress_overrides(self, src: str) -> list[tuple[str, float]]:
        """(destination address, bytes/s) for every peer whose rate from `src` differs from src's default."""
        default = self.host(src).bandwidth_bytes_per_s
        return [(h.address, self.rate(src, h.name)) for h in self.hosts
                if h.name != src and self.rate(src, h.name) != default]

    def ingress_rules(self, dst: str) -> tuple[Impairment, list[tuple[str, Impairment]]]:
        """The default impairment into `dst` and (source address, impairment) where a link overrides it."""
        default = self.impairment(None, dst)
        overrides = [(h.address, self.impairment(h.name, dst)) for h in self.hosts
                     if h.name != dst and self.impairment(h.name, dst) != default]
        return default, overrides

    @property
    def has_impairments(self) -> bool:
        return any(not self.impairment(src, dst.name).is_none
                   for dst in self.hosts for src in [None, *(h.name for h in self.hosts if h.name != dst.name)])


def plan_lab(spec: LabSpec, cores: int, source: str = "spec") -> LabPlan:
    """Resolve presets and defaults into concrete per-host values; check them against this machine."""
    net = ipaddress.IPv4Network(spec.subnet)
    addresses = list(net.hosts())
    hosts = []
    for index, h in enumerate(spec.hosts):
        cpu = h.cpu if h.cpu is not None else preset_cpu(h.preset, spec.fastest_cpu, cores)
        if cpu > cores:
            raise BadInput(f"{source}: hosts.{index}.cpu: {cpu:g} cores is more than this machine's {cores}")
        memory = h.memory if h.memory is not None else preset_memory(h.preset, spec.memory_scale)
        hosts.append(HostPlan(
            index=index, name=h.name, address=str(addresses[index + 1]), preset=h.preset, cpu=cpu,
            memory_bytes=memory,
            bandwidth_bytes_per_s=h.bandwidth if h.bandwidth is not None else spec.bandwidth,
            delay_s=h.delay if h.delay is not None else spec.delay,
            loss_percent=h.loss if h.loss is not None else spec.loss,
        ))
    tag = lab_tag(spec.name)
    return LabPlan(spec=spec, tag=tag, bridge=bridge_name(tag), bridge_address=str(addresses[0]),
                   prefixlen=net.prefixlen, hosts=hosts)


def cluster_for(plan: LabPlan, known_hosts: str, identity_file: str, python: str) -> ClusterSpec:
    """The DESIGN.md cluster file of the lab: one SSH device per host, pair overrides where rates differ.

    A cluster file's bandwidth is symmetric, so a pair gets the slower of its two directions.
    """
    default = plan.spec.bandwidth
    links = []
    for i, a in enumerate(plan.hosts):
        for b in plan.hosts[i + 1:]:
            pair = min(plan.rate(a.name, b.name), plan.rate(b.name, a.name))
            if pair != default:
                links.append({"between": [a.name, b.name], "bandwidth": pair})
    return ClusterSpec.model_validate({
        "name": plan.spec.name,
        "bandwidth": default,
        "devices": [{"name": h.name, "host": h.address, "user": "root", "memory": h.memory_bytes,
                     "python": python} for h in plan.hosts],
        "links": links,
        "ssh": {"known_hosts": known_hosts, "identity_file": identity_file},
    })
