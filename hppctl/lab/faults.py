"""Failures on demand in a running lab (`hppctl lab fault`): what fault tolerance must survive.

Issue 7's four failures, and their undoing, on one host or several at once (`nano1,tx0`):

- `kill`: SIGKILL to the host's hppctl workers (a crashed device);
- `stop` / `cont`: SIGSTOP / SIGCONT to them (a hung device: alive, silent);
- `term`: SIGTERM to them (a device taken out on purpose: its worker hands its layers over and leaves);
- `link-down` / `link-up`: the host's `eth0` down or up inside its namespace (a device that drops
  off the network; its processes go on running).

A host's workers are the processes in its cgroup that run one of hppctl's worker modules
(`python -m hppctl.runtime…worker`); its sshd, SSH sessions and shells are left alone, so the
launcher sees the worker die as it would on a real device, not its SSH connection.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from hppctl.errors import BadInput, RuntimeFailure
from hppctl.lab import cgroups
from hppctl.lab.system import in_netns, sh
from hppctl.models.lab import HostState, LabState

SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT, "term": signal.SIGTERM}
LINKS = {"link-down": "down", "link-up": "up"}
ACTIONS = (*SIGNALS, *LINKS)


@dataclass(frozen=True)
class Fault:
    host: str
    action: str
    pids: tuple[int, ...] = ()
    """The workers signalled (empty for a link action)."""

    def describe(self) -> str:
        if self.action in LINKS:
            return f"{self.host}: eth0 {LINKS[self.action]}"
        name = SIGNALS[self.action].name
        return f"{self.host}: {name} to worker pid{'s' if len(self.pids) > 1 else ''} {', '.join(map(str, self.pids))}"


def is_worker(argv: list[str]) -> bool:
    """True for `… python -m hppctl.runtime[.x].worker …` (any of hppctl's worker modules)."""
    for flag, module in zip(argv, argv[1:]):
        if flag == "-m" and module.startswith("hppctl.runtime.") and module.endswith(".worker"):
            return True
    return False


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone meanwhile
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def worker_pids(host: HostState) -> list[int]:
    return [pid for pid in cgroups.procs(host.cgroups) if is_worker(_argv(pid))]


def find_host(state: LabState, name: str) -> HostState:
    for host in state.hosts:
        if host.name == name:
            return host
    raise BadInput(f"lab {state.name!r} has no host {name!r} (hosts: {', '.join(h.name for h in state.hosts)})")


def inject(state: LabState, host_name: str, action: str) -> Fault:
    """Apply `action` to host `host_name` of a running lab; RuntimeFailure if it has no worker to signal."""
    [fault] = inject_together(state, [host_name], action)
    return fault


def inject_together(state: LabState, host_names: list[str], action: str) -> list[Fault]:
    """Apply `action` to several hosts at once (devices that fail together: a power strip, a switch).
    Every host is checked first — known, with a worker to signal — so that a bad name hurts none."""
    if action not in ACTIONS:
        raise BadInput(f"fault: unknown action {action!r} ({', '.join(ACTIONS)})")
    hosts = [find_host(state, name) for name in host_names]
    for host in hosts:
        if host_names.count(host.name) > 1:
            raise BadInput(f"fault: host {host.name!r} is named twice")
    if action in LINKS:
        for host in hosts:
            sh(in_netns(host.netns, ["ip", "link", "set", "eth0", LINKS[action]]))
        return [Fault(host.name, action) for host in hosts]
    targets = [(host, worker_pids(host)) for host in hosts]
    for host, pids in targets:
        if not pids:
            raise RuntimeFailure(f"{host.name}: no hppctl worker is running there (nothing to {action})")
    return [_signal(host, pids, action) for host, pids in targets]


def _signal(host: HostState, pids: list[int], action: str) -> Fault:
    sent = []
    for pid in pids:
        try:
            os.kill(pid, SIGNALS[action])
            sent.append(pid)
        except ProcessLookupError:  # it ended between the listing and the signal
            continue
    if not sent:
        raise RuntimeFailure(f"{host.name}: its workers ended before the {action} reached them")
    return Fault(host.name, action, tuple(sent))
