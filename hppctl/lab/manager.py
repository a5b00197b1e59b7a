"""`lab up`, `lab down`, `lab status`: the steps, in order, with a state record for undoing them.

`up` writes `<state dir>/<lab>/state.json` *before* each resource is made usable, so a crash at
any point leaves a record that `down` follows; `down` then also sweeps by naming prefix
(namespaces `hppctl-lab-<lab>-*`, interfaces `hp?<tag>*`, cgroups `hppctl-lab-<lab>`), so even a
lost state directory leaves nothing behind. Every removal tolerates "already gone": `down` is
idempotent.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from hppctl.errors import BadInput
from hppctl.lab import cgroups, network, shaping, sshd
from hppctl.lab.layout import (CGROUP_PREFIX, LINK_PATTERN, NETNS_PREFIX, LabPlan, bridge_name, cgroup_lab_dir_name,
                               cluster_for, lab_tag, netns_name, peer_name, plan_lab, veth_name)
from hppctl.lab.system import BASE_TOOLS, DELAY_LINE_TOOL, in_netns, require, tool
from hppctl.models.lab import HostState, LabSpec, LabState
from hppctl.store import load, save, write_text_atomic

DEFAULT_STATE_ROOT = Path(os.environ.get("HPPCTL_LAB_STATE_DIR", "/run/hppctl-lab"))
STATE_FILE = "state.json"


# --- the state record -----------------------------------------------------------------------------


class Recorder:
    """The lab's state, saved atomically after every change (LabState is immutable: we replace it)."""

    def __init__(self, state: LabState):
        self.state = state
        self.path = Path(state.state_dir) / STATE_FILE
        self.save()

    def save(self) -> None:
        save(self.path, self.state)

    def set(self, **changes) -> None:
        self.state = self.state.model_copy(update=changes)
        self.save()

    def add_host(self, host: HostState) -> None:
        self.set(hosts=[*self.state.hosts, host])

    def set_host(self, name: str, **changes) -> None:
        self.set(hosts=[h.model_copy(update=changes) if h.name == name else h for h in self.state.hosts])


def lab_state_dir(state_root: Path, name: str) -> Path:
    return Path(state_root) / name


def read_state(state_dir: Path) -> LabState | None:
    path = Path(state_dir) / STATE_FILE
    return load(path, LabState) if path.exists() else None


def list_states(state_root: Path) -> list[LabState]:
    root = Path(state_root)
    if not root.is_dir():
        return []
    states = []
    for d in sorted(root.iterdir()):
        state = read_state(d) if d.is_dir() else None
        if state is not None:
            states.append(state)
    return states


# --- up ---------------------------------------------------------------------------------------------


@dataclass
class UpResult:
    state: LabState
    plan: LabPlan
    warnings: list[str] = field(default_factory=list)


def preflight() -> cgroups.Hierarchy:
    """Everything `up` needs from this machine (root, tools, cgroup controllers), checked before anything is made."""
    require("hppctl lab up")
    return cgroups.detect()


def up(spec: LabSpec, source: str, state_root: Path = DEFAULT_STATE_ROOT, out: Path | None = None,
       cgroup_parent: str = "") -> UpResult:
    """Build the lab described by `spec` (loaded from `source`); on any failure undo what was made."""
    hier = preflight()
    plan = plan_lab(spec, os.cpu_count() or 1, source)
    warnings = _memory_warnings(plan)
    state_dir = lab_state_dir(state_root, spec.name)
    _refuse_if_present(spec.name, state_dir)
    network.check_subnet_free(spec.subnet)

    state_dir.mkdir(mode=0o700, parents=True)
    rec = Recorder(LabState(name=spec.name, tag=plan.tag, state_dir=str(state_dir.resolve()), subnet=spec.subnet,
                            cgroup_version=hier.version))
    try:
        _build(plan, rec, hier, cgroup_parent, out)
    except BaseException:
        down_state(rec.state)
        raise
    return UpResult(rec.state, plan, warnings)


def _memory_warnings(plan: LabPlan) -> list[str]:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return []
    limits = sum(h.memory_bytes for h in plan.hosts)
    if limits > total:
        return [f"the hosts' memory limits add up to {limits / 2**30:.1f} GiB, more than this machine's "
                f"{total / 2**30:.1f} GiB: the limits cap each host, but together they can exhaust RAM"]
    return []


def _refuse_if_present(name: str, state_dir: Path) -> None:
    leftovers = network.lab_netns(name) + network.lab_links(lab_tag(name))
    if state_dir.exists() or leftovers:
        raise BadInput(f"lab {name!r} is already up or was not cleaned up ({state_dir if state_dir.exists() else ', '.join(leftovers)}): "
                       f"run `hppctl lab down --name {name}` first")


def _build(plan: LabPlan, rec: Recorder, hier: cgroups.Hierarchy, cgroup_parent: str, out: Path | None) -> None:
    state_dir = Path(rec.state.state_dir)
    python = sys.executable
    identity = state_dir / "id_ed25519"
    user_key = sshd.generate_key(identity, f"hppctl-lab-{plan.spec.name}")
    authorized = state_dir / "authorized_keys"
    authorized.write_text(user_key + "\n")
    authorized.chmod(0o600)

    rec.set(bridge=plan.bridge, bridge_address=plan.bridge_address)
    network.create_bridge(plan.bridge, plan.bridge_address, plan.prefixlen)

    rec.set(cgroup_lab_dirs=[str(d) for d in cgroups.lab_dirs(hier, plan.spec.name, cgroup_parent)])
    lab_dirs = cgroups.create_lab(hier, plan.spec.name, cgroup_parent)

    for h in plan.hosts:
        netns = netns_name(plan.spec.name, h.name)
        rec.add_host(HostState(name=h.name, address=h.address, netns=netns, veth=veth_name(plan.tag, h.index),
                               preset=h.preset, cpu=h.cpu, memory_bytes=h.memory_bytes,
                               bandwidth_bytes_per_s=h.bandwidth_bytes_per_s, delay_s=h.delay_s,
                               loss_percent=h.loss_percent))
        network.create_netns(netns)
        network.attach_host(netns, veth_name(plan.tag, h.index), peer_name(plan.tag, h.index), plan.bridge,
                            h.address, plan.prefixlen)
        dirs = cgroups.create_host(hier, lab_dirs, h.name, h.cpu, h.memory_bytes,
                                   period_us=round(plan.spec.cpu_period * 1e6))
        rec.set_host(h.name, cgroups=[str(d) for d in dirs])
        shaping.apply(shaping.egress_commands("eth0", h.bandwidth_bytes_per_s, plan.egress_overrides(h.name)), netns)

    _set_up_impairments(plan, rec)

    known_hosts_lines = []
    for h in plan.hosts:
        host_dir = state_dir / "hosts" / h.name
        host_dir.mkdir(parents=True, exist_ok=True)
        host_key = sshd.generate_key(host_dir / "ssh_host_ed25519_key", f"{h.name}@hppctl-lab-{plan.spec.name}")
        known_hosts_lines.append(sshd.known_hosts_line(h.address, host_key))
        config = host_dir / "sshd_config"
        pid_file = host_dir / "sshd.pid"
        config.write_text(sshd.sshd_config(h.address, host_dir / "ssh_host_ed25519_key", authorized, pid_file,
                                           sshd.session_environment(h.name, h.cpu, python)))
        host_state = next(s for s in rec.state.hosts if s.name == h.name)
        pid = sshd.start(host_state.netns, h.name, config, host_dir / "sshd.log", pid_file, host_state.cgroups)
        rec.set_host(h.name, sshd_pid=pid)

    known_hosts = state_dir / "known_hosts"
    write_text_atomic(known_hosts, "\n".join(known_hosts_lines) + "\n")
    write_text_atomic(state_dir / "ssh_config", sshd.ssh_config_text(
        [(h.name, h.address) for h in plan.hosts], str(identity), str(known_hosts)))
    for h in plan.hosts:
        sshd.wait_for_banner(h.address)

    cluster_file = Path(out) if out is not None else state_dir / "cluster.yaml"
    save(cluster_file, cluster_for(plan, str(known_hosts), str(identity), python))
    rec.set(cluster_file=str(cluster_file.resolve()), known_hosts=str(known_hosts), identity_file=str(identity),
            complete=True)


def _set_up_impairments(plan: LabPlan, rec: Recorder) -> None:
    """Delay and loss on each host's ingress, by netem where the kernel has it, else the delay line."""
    if not plan.has_impairments:
        rec.set(delay_backend="none")
        return
    backend = plan.spec.delay_backend
    first_netns = rec.state.hosts[0].netns
    if backend == "auto":
        backend = "netem" if shaping.netem_available(first_netns) else "nfqueue"
    if backend == "nfqueue":
        require("delay and loss without netem", (DELAY_LINE_TOOL,), need_root=False)
    rec.set(delay_backend=backend)
    state_dir = Path(rec.state.state_dir)
    for h in plan.hosts:
        netns = netns_name(plan.spec.name, h.name)
        default, overrides = plan.ingress_rules(h.name)
        if backend == "netem":
            shaping.apply(shaping.netem_ingress_commands(veth_name(plan.tag, h.index), default, overrides))
            continue
        rules, queues = shaping.nfqueue_plan(plan.spec.subnet, default, overrides)
        if not queues:
            continue
        # The delay line must be listening before packets are queued to it (unbound queues drop).
        service_dirs = cgroups.create_service([Path(d) for d in rec.state.cgroup_lab_dirs])
        pid = _start_delay_line(netns, queues, state_dir / "hosts" / h.name, [str(d) for d in service_dirs])
        rec.set_host(h.name, delayline_pid=pid)
        rec.set(firewall=shaping.apply_nfqueue_rules(netns, rules))


def _start_delay_line(netns: str, queues: list[str], host_dir: Path, cgroup_dirs: list[str]) -> int:
    host_dir.mkdir(parents=True, exist_ok=True)
    pid_file, log = host_dir / "delayline.pid", host_dir / "delayline.log"
    argv = in_netns(netns, [sys.executable, "-m", "hppctl.lab.delayline", "--pidfile", str(pid_file)])
    for q in queues:
        argv += ["--queue", q]
    with open(log, "ab") as log_file:
        # A session of its own, so it outlives `lab up` and no terminal signal reaches it.
        subprocess.Popen([tool("ip"), *argv[1:]], stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                         start_new_session=True, close_fds=True, preexec_fn=lambda: cgroups.enter(cgroup_dirs))
    return sshd.wait_for_pid_file(pid_file, 10.0, f"the delay line in {netns}", log)


# --- down -------------------------------------------------------------------------------------------


@dataclass
class DownReport:
    labs: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    left_alone: list[str] = field(default_factory=list)
    """Other labs seen on this machine and not touched (not recorded in this state dir)."""


def down(state_root: Path = DEFAULT_STATE_ROOT, name: str | None = None, everything: bool = False) -> DownReport:
    """Remove what this state dir owns: the named lab, or the only lab recorded here (or, with
    `everything`, every lab recorded here and anything named like a lab on the machine).

    Without `everything`, the name sweep covers only the chosen lab's names: a state dir without a
    lab removes nothing, and labs of other state dirs (other users on a shared machine) are listed
    in `left_alone`, never swept. Every record is checked (`check_owned`) before anything goes."""
    require("hppctl lab down", tools=tuple(t for t in BASE_TOOLS if t.command == "ip"))
    states = list_states(state_root)
    if name is not None:
        chosen = [s for s in states if s.name == name]
    elif everything or len(states) <= 1:
        chosen = states
    else:
        raise BadInput(f"several labs are up ({', '.join(s.name for s in states)}): name one with --name, or use --all")
    roots = _cgroup_roots()
    for state in chosen:
        check_owned(state, lab_state_dir(state_root, state.name), roots)
    report = DownReport(labs=[s.name for s in chosen])
    for state in chosen:
        report.removed += down_state(state)
    # The backstop sweep, by name: the named lab's, the chosen labs'; any lab's only with --all.
    targets: list[str | None] = [None] if everything else sorted({*report.labs, *([name] if name else [])})
    for lab in targets:
        report.removed += sweep(lab, spare=_other_lab_names(lab, states)) if lab else sweep(None)
    if not everything:
        report.left_alone = [lab for lab in labs_seen() if lab not in targets]
    return report


def _cgroup_roots() -> list[Path]:
    """The cgroup hierarchies' mount points (none when the machine has no usable controllers)."""
    try:
        return cgroups.detect().unique_roots()
    except BadInput:
        return []


def _other_lab_names(lab: str, states: list[LabState]) -> list[str]:
    """Labs whose names extend `lab` (`a-b` beside `a`): their namespaces start with `lab`'s prefix."""
    known = {s.name for s in states} | set(labs_seen())
    return sorted(other for other in known if other != lab and other.startswith(f"{lab}-"))


def labs_seen() -> list[str]:
    """Names of the labs whose cgroups or namespaces exist on this machine, whoever made them.

    A cgroup `hppctl-lab-<lab>` names its lab exactly; a namespace `hppctl-lab-<lab>-<host>` only
    up to where the host name starts (both may hold `-`), so it counts only when no cgroup explains it."""
    names = set()
    try:
        names.update(d.name[len(CGROUP_PREFIX):] for d in cgroups.find_lab_dirs(cgroups.detect()))
    except BadInput:  # no cgroup hierarchy this lab code can use: the namespaces alone name the labs
        pass
    for netns in network.lab_netns():
        rest = netns[len(NETNS_PREFIX):]
        if not any(rest.startswith(f"{lab}-") for lab in names):
            names.add(rest.rsplit("-", 1)[0])
    return sorted(names)


def check_owned(state: LabState, state_dir: Path, cgroup_roots: list[Path]) -> None:
    """Refuse (BadInput, nothing removed) a state record naming anything outside its own lab.

    `down` deletes what state.json names: its state dir recursively, cgroup directories (killing
    every process in them), namespaces and links. A tampered or stray record could point those at
    another lab or at any directory, so each must be what `up` makes for this lab: the state dir
    where the record lies, cgroups `<cgroup root>/.../hppctl-lab-<lab>[/<host>]`, namespaces
    `hppctl-lab-<lab>-<host>`, links with the lab's tag."""
    source = Path(state_dir) / STATE_FILE
    own_dir = Path(state_dir).resolve()

    def refuse(field_name: str, value: object, why: str) -> None:
        raise BadInput(f"{source}: {field_name}: {str(value)[:200]!r} {why}: refusing to remove anything "
                       f"(remove what is left by hand, or fix the record)")

    if state.name != own_dir.name:
        refuse("name", state.name, f"is not the lab of this directory ({own_dir.name})")
    if Path(state.state_dir).resolve() != own_dir:
        refuse("state_dir", state.state_dir, f"is not the directory holding the record ({own_dir})")
    if state.tag != lab_tag(state.name):
        refuse("tag", state.tag, f"is not lab {state.name!r}'s tag ({lab_tag(state.name)})")
    lab_dirs = [Path(d).resolve() for d in state.cgroup_lab_dirs]
    for i, d in enumerate(lab_dirs):
        if d.name != cgroup_lab_dir_name(state.name) or not any(d.is_relative_to(r.resolve()) and d != r.resolve()
                                                                 for r in cgroup_roots):
            refuse(f"cgroup_lab_dirs.{i}", state.cgroup_lab_dirs[i],
                   f"is not a cgroup {cgroup_lab_dir_name(state.name)} under {', '.join(map(str, cgroup_roots)) or 'a cgroup root'}")
    if state.bridge is not None and state.bridge != bridge_name(state.tag):
        refuse("bridge", state.bridge, f"is not lab {state.name!r}'s bridge ({bridge_name(state.tag)})")
    for i, host in enumerate(state.hosts):
        if host.netns != netns_name(state.name, host.name):
            refuse(f"hosts.{i}.netns", host.netns, f"is not host {host.name!r}'s namespace ({netns_name(state.name, host.name)})")
        if not (LINK_PATTERN.match(host.veth) and host.veth[3:9] == state.tag):
            refuse(f"hosts.{i}.veth", host.veth, f"is not an interface of lab {state.name!r} (hpv{state.tag}-N)")
        for j, d in enumerate(host.cgroups):
            if Path(d).resolve().parent not in lab_dirs:
                refuse(f"hosts.{i}.cgroups.{j}", d, "is not a child of the lab's cgroups (cgroup_lab_dirs)")


def down_state(state: LabState) -> list[str]:
    """Undo everything `state` records, in reverse order of creation; tolerate what is already gone."""
    removed = []
    for host in state.hosts:
        for pid in (host.sshd_pid, host.delayline_pid):
            if pid is not None and _is_ours(pid, state.state_dir):
                _terminate(pid)
        for pid in network.netns_pids(host.netns):
            _kill(pid)
        if network.netns_exists(host.netns):
            network.delete_netns(host.netns)
            removed.append(f"netns {host.netns}")
        if network.link_exists(host.veth):
            network.delete_link(host.veth)
            removed.append(f"link {host.veth}")
    if state.bridge and network.link_exists(state.bridge):
        network.delete_link(state.bridge)
        removed.append(f"link {state.bridge}")
    host_cgroups = [d for h in state.hosts for d in h.cgroups]
    for d in [*host_cgroups, *state.cgroup_lab_dirs]:
        if Path(d).is_dir():
            cgroups.remove([d])
            removed.append(f"cgroup {d}")
    state_dir = Path(state.state_dir)
    if (state_dir / STATE_FILE).exists():
        shutil.rmtree(state_dir, ignore_errors=True)
        removed.append(f"state {state_dir}")
    return removed


def sweep(lab: str | None, spare: list[str] = ()) -> list[str]:
    """Remove whatever is named like lab `lab`'s (or any lab's) resources: the crash-proof backstop.
    `spare`: labs whose namespaces share `lab`'s prefix (`a-b-*` for `a`), left alone."""
    removed = []
    spared = tuple(f"{NETNS_PREFIX}{other}-" for other in spare)
    for netns in network.lab_netns(lab):
        if netns.startswith(spared):
            continue
        for pid in network.netns_pids(netns):
            _kill(pid)
        network.delete_netns(netns)
        removed.append(f"netns {netns} (swept)")
    for link in network.lab_links(lab_tag(lab) if lab else None):
        if network.link_exists(link):
            network.delete_link(link)
            removed.append(f"link {link} (swept)")
    try:
        hier = cgroups.detect()
    except BadInput:
        return removed
    for d in cgroups.find_lab_dirs(hier, lab):
        cgroups.remove([str(d)])
        removed.append(f"cgroup {d} (swept)")
    return removed


def _is_ours(pid: int, state_dir: str) -> bool:
    """Signal a recorded pid only while it is still the process we started: its command line names
    our state directory (sshd re-titles itself but keeps `-f <state dir>/.../sshd_config`)."""
    try:
        return state_dir.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _terminate(pid: int, grace_s: float = 2.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or _is_zombie(pid):
            return
        time.sleep(0.02)
    _kill(pid)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _named(states: list[LabState], name: str, state_root: Path) -> list[LabState]:
    chosen = [s for s in states if s.name == name]
    if not chosen:
        raise BadInput(f"no lab named {name!r} under {state_root} (`hppctl lab status` lists them)")
    return chosen


def the_lab(state_root: Path = DEFAULT_STATE_ROOT, name: str | None = None) -> LabState:
    """The lab named `name`, or the only one that is up."""
    states = list_states(state_root)
    if name is not None:
        return _named(states, name, state_root)[0]
    if not states:
        raise BadInput(f"no lab is up (state dir {state_root})")
    if len(states) > 1:
        raise BadInput(f"several labs are up ({', '.join(s.name for s in states)}): name one with --name")
    return states[0]


# --- status -----------------------------------------------------------------------------------------


def status(state_root: Path = DEFAULT_STATE_ROOT, name: str | None = None) -> list[dict]:
    """What each lab is and how its hosts are doing: limits, memory use, OOM kills, sshd answering."""
    states = list_states(state_root)
    return [_lab_status(s) for s in (states if name is None else _named(states, name, state_root))]


def _lab_status(state: LabState) -> dict:
    bridge_up = bool(state.bridge) and network.link_exists(state.bridge)
    hosts = []
    for h in state.hosts:
        stats = cgroups.stats(h.cgroups)
        # Probe sshd only through the lab bridge: never send a packet to an address we do not own.
        answers = bool(bridge_up and network.route_is_lab(h.address) and sshd.banner(h.address, timeout_s=1.0))
        hosts.append({
            "name": h.name, "address": h.address, "preset": h.preset, "cpu": h.cpu,
            # memory_limit_bytes is the cgroup's (from `stats`, None once the cgroup is gone)
            "memory_limit_recorded_bytes": h.memory_bytes, "bandwidth_bytes_per_s": h.bandwidth_bytes_per_s,
            "delay_s": h.delay_s, "loss_percent": h.loss_percent, "netns": h.netns,
            "netns_exists": network.netns_exists(h.netns), "cgroups": h.cgroups,
            "sshd_pid": h.sshd_pid, "sshd_running": h.sshd_pid is not None and _is_ours(h.sshd_pid, state.state_dir),
            "ssh_answers": answers,
            "delayline_running": None if h.delayline_pid is None else _is_ours(h.delayline_pid, state.state_dir),
            **stats,
        })
    return {"name": state.name, "complete": state.complete, "state_dir": state.state_dir, "subnet": state.subnet,
            "bridge": state.bridge, "bridge_address": state.bridge_address, "cgroup_version": state.cgroup_version,
            "delay_backend": state.delay_backend, "cluster_file": state.cluster_file,
            "known_hosts": state.known_hosts, "identity_file": state.identity_file,
            "ssh_config": str(Path(state.state_dir) / "ssh_config"), "hosts": hosts}


def lab_down_leftovers(lab: str | None = None) -> list[str]:
    """What of a lab (or any lab) still exists: namespaces, interfaces, cgroups. Empty after `down`."""
    found = [f"netns {n}" for n in network.lab_netns(lab)]
    found += [f"link {n}" for n in network.lab_links(lab_tag(lab) if lab else None)]
    try:
        found += [f"cgroup {d}" for d in cgroups.find_lab_dirs(cgroups.detect(), lab)]
    except BadInput:
        pass
    return found

