"""Link emulation: rate on each host's egress (tc htb), delay and loss on its ingress.

Rate: an htb tree on `eth0` inside the host's namespace. Class 1:1 (the default) carries the
host's bandwidth; each peer with a per-pair override gets its own class, chosen by a u32 filter
on the destination address. Classes never borrow (ceil = rate), so each is an exact cap.

Delay and loss are applied where a packet *arrives* (not where it leaves): a packet held on the
sender's side still counts against the sending socket's TCP small-queue budget (~1 ms of data),
which would throttle a 5 ms-delayed 100 Mbit/s flow to a fraction of its rate. Two backends:
- netem: an htb classifier + netem leaves on this machine's end of the host's veth (the
  packet's last hop before the host), per-source classes for link overrides;
- nfqueue: for kernels without sch_netem. iptables sends packets entering the host to NFQUEUE
  queues; hppctl.lab.delayline releases them after the delay and drops the lost ones.
Either way a host's round trip to a peer is the sum of both ends' delays (or 2x a link's delay).

The command builders are pure (unit-tested); `apply_*` run them.
"""

from __future__ import annotations

from hppctl.lab.layout import Impairment
from hppctl.lab.system import LabCommandFailed, in_netns, sh, which

UNSHAPED_BITS = 10_000_000_000  # htb classes that only classify (netem backend) get 10 Gbit/s
NETEM_LIMIT = 100_000  # packets netem may hold: 1 s at 100 Mbit/s of MTU-sized packets


def _bits(bytes_per_s: float) -> str:
    return f"{round(bytes_per_s * 8)}bit"


def _quantum(bytes_per_s: float) -> str:
    # htb warns when rate/r2q falls outside [1 MTU, 200 kB]; the quantum only matters between
    # sibling classes that borrow, and ours never borrow, so any in-range value is right.
    return str(int(min(200_000, max(1_600, bytes_per_s / 10))))


def _htb_class(dev: str, classid: str, bytes_per_s: float) -> list[str]:
    rate = _bits(bytes_per_s)
    return ["tc", "class", "add", "dev", dev, "parent", "1:", "classid", classid, "htb",
            "rate", rate, "ceil", rate, "quantum", _quantum(bytes_per_s)]


def egress_commands(dev: str, default_bytes_per_s: float, overrides: list[tuple[str, float]]) -> list[list[str]]:
    """tc commands (run inside the host's namespace) that cap its egress, per destination where overridden."""
    cmds = [["tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "1"],
            _htb_class(dev, "1:1", default_bytes_per_s)]
    for k, (address, rate) in enumerate(overrides, start=2):
        cmds.append(_htb_class(dev, f"1:{k}", rate))
        cmds.append(["tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1",
                     "u32", "match", "ip", "dst", f"{address}/32", "flowid", f"1:{k}"])
    return cmds


def _netem_args(imp: Impairment) -> list[str]:
    args = ["netem", "limit", str(NETEM_LIMIT)]
    if imp.delay_s:
        args += ["delay", f"{round(imp.delay_s * 1e6)}us"]
    if imp.loss_percent:
        args += ["loss", f"{imp.loss_percent:g}%"]
    return args


def netem_ingress_commands(veth: str, default: Impairment, overrides: list[tuple[str, Impairment]]) -> list[list[str]]:
    """tc commands (this machine's namespace) on the host's veth: netem per source where overridden."""
    if default.is_none and all(imp.is_none for _, imp in overrides):
        return []
    cmds = [["tc", "qdisc", "replace", "dev", veth, "root", "handle", "1:", "htb", "default", "1"],
            _htb_class(veth, "1:1", UNSHAPED_BITS / 8)]
    if not default.is_none:
        cmds.append(["tc", "qdisc", "add", "dev", veth, "parent", "1:1", "handle", "10:", *_netem_args(default)])
    for k, (address, imp) in enumerate(overrides, start=2):
        cmds.append(_htb_class(veth, f"1:{k}", UNSHAPED_BITS / 8))
        if not imp.is_none:
            cmds.append(["tc", "qdisc", "add", "dev", veth, "parent", f"1:{k}", "handle", f"{10 + k}:",
                         *_netem_args(imp)])
        cmds.append(["tc", "filter", "add", "dev", veth, "parent", "1:", "protocol", "ip", "prio", "1",
                     "u32", "match", "ip", "src", f"{address}/32", "flowid", f"1:{k}"])
    return cmds


def nfqueue_plan(subnet: str, default: Impairment, overrides: list[tuple[str, Impairment]]):
    """(iptables rule arguments, delay-line queue specs) for one host's ingress.

    Queue numbers: one per distinct impairment, so each queue has a single delay and releases in
    arrival order. Overrides come first (first match wins); a source whose link has no
    impairment is accepted before the default rule can queue it. Loopback is never delayed.
    """
    queues: dict[Impairment, int] = {}
    rules = [["-i", "lo", "-j", "ACCEPT"]]
    for address, imp in overrides:
        if imp.is_none:
            rules.append(["-s", f"{address}/32", "-j", "ACCEPT"])
        else:
            number = queues.setdefault(imp, len(queues))
            rules.append(["-s", f"{address}/32", "-j", "NFQUEUE", "--queue-num", str(number)])
    if not default.is_none:
        number = queues.setdefault(default, len(queues))
        rules.append(["-s", subnet, "-j", "NFQUEUE", "--queue-num", str(number)])
    specs = [f"{number}:{imp.delay_s!r}:{imp.loss_percent / 100!r}" for imp, number in queues.items()]
    return (rules if specs else []), specs


def apply(commands: list[list[str]], netns: str | None = None) -> None:
    for cmd in commands:
        if netns is not None and cmd[0] == "tc":
            cmd = ["tc", "-n", netns, *cmd[1:]]
        sh(cmd)


def netem_available(netns: str) -> bool:
    """Whether this kernel has sch_netem: try it on the namespace's loopback, then remove it."""
    probe = sh(["tc", "-n", netns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], check=False)
    if probe.returncode != 0:
        return False
    sh(["tc", "-n", netns, "qdisc", "del", "dev", "lo", "root"], check=False)
    return True


def apply_nfqueue_rules(netns: str, rules: list[list[str]]) -> str:
    """Install the rules with the first iptables flavour that accepts them all; return its name.

    Debian's `iptables` is the nf_tables flavour; some kernels only support NFQUEUE through the
    legacy one, so a flavour that fails is flushed and the next one tried.
    """
    errors = []
    for flavour in ("iptables", "iptables-legacy", "iptables-nft"):
        if which(flavour) is None:
            continue
        for rule in rules:
            result = sh(in_netns(netns, [flavour, "-w", "-A", "INPUT", *rule]), check=False)
            if result.returncode != 0:
                errors.append(f"{flavour}: {result.stderr.strip()}")
                sh(in_netns(netns, [flavour, "-w", "-F", "INPUT"]), check=False)
                break
        else:
            return flavour
    raise LabCommandFailed(f"no iptables could install the delay line's NFQUEUE rules ({'; '.join(errors) or 'none installed'})")
