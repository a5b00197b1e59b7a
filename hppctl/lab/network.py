"""Network namespaces, veth pairs and the lab bridge.

Topology: one bridge in this machine's namespace holds the subnet's first address (so people
and hppctl reach the hosts from here), and one veth pair per host joins the bridge to `eth0`
inside the host's namespace. A host's namespace has no default route, only its subnet, so
nothing sent from a lab host can leave the lab; this machine routes the subnet to the bridge only
while the lab is up, and `route_is_lab` lets callers check that before they connect.
"""

from __future__ import annotations

import ipaddress
import os

from hppctl.errors import BadInput
from hppctl.lab.layout import LINK_PATTERN, NETNS_PREFIX
from hppctl.lab.system import in_netns, sh


def _disable_ipv6(interface: str) -> None:
    """The lab is IPv4-only; without this every interface would chatter router solicitations."""
    path = f"/proc/sys/net/ipv6/conf/{interface}/disable_ipv6"
    if os.path.exists(path):
        with open(path, "w") as f:
            f.write("1\n")


_ROUTE_TYPES = {"unicast", "local", "broadcast", "multicast", "throw", "unreachable", "prohibit",
                "blackhole", "nat", "anycast"}


def route_destinations(route_lines: list[str]) -> list[tuple[ipaddress.IPv4Network, str]]:
    """(destination, line) of every non-default route in `ip -4 route show table all` output."""
    found = []
    for line in route_lines:
        words = line.split()
        if words and words[0] in _ROUTE_TYPES:
            words = words[1:]
        if not words or words[0] == "default":
            continue
        try:
            found.append((ipaddress.IPv4Network(words[0], strict=False), line.strip()))
        except ValueError:
            continue
    return found


def check_subnet_free(subnet: str) -> None:
    """Refuse a subnet that overlaps a route this machine already has (another lab, a LAN, a VPN)."""
    net = ipaddress.IPv4Network(subnet)
    lines = sh(["ip", "-4", "route", "show", "table", "all"]).stdout.splitlines()
    for other, line in route_destinations(lines):
        if net.overlaps(other):
            raise BadInput(f"subnet {subnet} overlaps this machine's route `{line}`: "
                           f"choose another `subnet:` in the lab spec")


def free_subnet(first: int = 100, base: str = "10.213") -> str:
    """The first `base.N.0/24` (N from `first`) that overlaps none of this machine's routes.

    Tests and benchmarks take their lab subnet from here: a fixed subnet collides with any other
    lab running on the same machine (a benchmark beside the test suite, a second CI job)."""
    lines = sh(["ip", "-4", "route", "show", "table", "all"]).stdout.splitlines()
    taken = [net for net, _ in route_destinations(lines)]
    for n in range(first, 256):
        candidate = ipaddress.IPv4Network(f"{base}.{n}.0/24")
        if not any(candidate.overlaps(t) for t in taken):
            return str(candidate)
    raise BadInput(f"no free /24 left in {base}.{first}-255.0: every one overlaps a route of this machine")


def create_bridge(bridge: str, address: str, prefixlen: int) -> None:
    sh(["ip", "link", "add", bridge, "type", "bridge"])
    _disable_ipv6(bridge)
    sh(["ip", "addr", "add", f"{address}/{prefixlen}", "dev", bridge])
    sh(["ip", "link", "set", bridge, "up"])


def create_netns(netns: str) -> None:
    sh(["ip", "netns", "add", netns])
    sh(in_netns(netns, ["sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; "
                                    "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6"]), check=False)
    sh(["ip", "-n", netns, "link", "set", "lo", "up"])


def attach_host(netns: str, veth: str, peer: str, bridge: str, address: str, prefixlen: int) -> None:
    """A veth pair: `veth` on the bridge here, its peer renamed `eth0` inside `netns` with `address`."""
    sh(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer, "netns", netns])
    _disable_ipv6(veth)
    sh(["ip", "-n", netns, "link", "set", peer, "name", "eth0"])
    sh(["ip", "-n", netns, "addr", "add", f"{address}/{prefixlen}", "dev", "eth0"])
    sh(["ip", "-n", netns, "link", "set", "eth0", "up"])
    sh(["ip", "link", "set", veth, "master", bridge])
    sh(["ip", "link", "set", veth, "up"])


def netns_exists(netns: str) -> bool:
    return os.path.exists(f"/run/netns/{netns}")


def netns_pids(netns: str) -> list[int]:
    if not netns_exists(netns):
        return []
    out = sh(["ip", "netns", "pids", netns], check=False).stdout
    return [int(word) for word in out.split() if word.isdigit()]


def delete_netns(netns: str) -> None:
    """Deleting the namespace also destroys the veth inside it, and with it the pair."""
    if netns_exists(netns):
        sh(["ip", "netns", "delete", netns], check=False)


def link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def delete_link(name: str) -> None:
    if link_exists(name):
        sh(["ip", "link", "delete", name], check=False)


def lab_links(tag: str | None = None) -> list[str]:
    """Interfaces in this namespace named like a lab's (of lab `tag`, or of any lab)."""
    names = os.listdir("/sys/class/net") if os.path.isdir("/sys/class/net") else []
    return sorted(n for n in names if LINK_PATTERN.match(n) and (tag is None or n[3:9] == tag))


def lab_netns(lab: str | None = None) -> list[str]:
    """Namespaces named like a lab's hosts (of lab `lab`, or of any lab)."""
    names = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
    prefix = NETNS_PREFIX + (f"{lab}-" if lab else "")
    return sorted(n for n in names if n.startswith(prefix))


def route_is_lab(address: str) -> bool:
    """True when this machine sends `address` to a lab bridge: connecting to it stays on this machine."""
    result = sh(["ip", "-4", "route", "get", address], check=False)
    words = result.stdout.split()
    return result.returncode == 0 and "dev" in words and LINK_PATTERN.match(words[words.index("dev") + 1]) is not None
