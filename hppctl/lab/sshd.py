"""Keys, known_hosts and one sshd per lab host.

The lab makes its own trust: a user key pair (whose public half every host authorises for root)
and a host key per host, written to a `known_hosts` file that the cluster file points to. Clients
keep host-key checking on: a host that answers with another key is refused.

Each sshd runs inside its host's network namespace, listening only on the host's address, in a
UTS namespace whose hostname is the host's name, and inside the host's cgroup(s) - it is moved
there between fork and exec, so every session and command it starts inherits the limits.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import time
from pathlib import Path

from hppctl.lab import cgroups
from hppctl.lab.system import LabCommandFailed, sh, tool

PRIVSEP_DIR = Path("/run/sshd")
"""sshd refuses to start without its privilege-separation directory (systemd would make it)."""


def generate_key(path: Path, comment: str) -> str:
    """An ed25519 key pair at `path` and `path.pub`; returns the public line."""
    if not path.exists():
        sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    return path.with_name(path.name + ".pub").read_text().strip()


def known_hosts_line(address: str, public_key_line: str) -> str:
    kind, blob = public_key_line.split()[:2]
    return f"{address} {kind} {blob}"


def session_environment(host: str, cpu: float, python: str) -> dict[str, str]:
    """Variables every SSH session on the host gets (sshd's SetEnv).

    PATH starts with this machine's Python, so `python3` over SSH is the interpreter hppctl runs
    under (the hosts share this machine's filesystem). OMP_NUM_THREADS matches the CPU quota: a
    0.25-core host running two BLAS threads would only add throttling, not speed.
    """
    path = f"{os.path.dirname(python)}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return {"PATH": path, "HPPCTL_LAB_HOST": host, "OMP_NUM_THREADS": str(max(1, math.ceil(cpu)))}


def sshd_config(address: str, host_key: Path, authorized_keys: Path, pid_file: Path, env: dict[str, str]) -> str:
    setenv = " ".join(f'"{k}={v}"' for k, v in env.items())
    return "\n".join([
        "# Written by hppctl lab up; removed by hppctl lab down.",
        f"ListenAddress {address}",
        "Port 22",
        f"HostKey {host_key}",
        f"PidFile {pid_file}",
        f"AuthorizedKeysFile {authorized_keys}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        # The state dir may live under /tmp (world-writable): StrictModes would then refuse our
        # authorized_keys. The lab writes that file itself, mode 0600 in a 0700 directory.
        "StrictModes no",
        "UseDNS no",
        "PrintMotd no",
        "X11Forwarding no",
        "MaxStartups 64:30:128",
        "MaxSessions 64",
        "Subsystem sftp internal-sftp",
        f"SetEnv {setenv}",
        "",
    ])


def check_config(config: Path) -> None:
    result = sh([tool("sshd"), "-t", "-f", str(config)], check=False)
    if result.returncode != 0:
        raise LabCommandFailed(f"sshd rejects {config}: {result.stderr.strip()}")


def start(netns: str, hostname: str, config: Path, log: Path, pid_file: Path, cgroup_dirs: list[str],
          timeout_s: float = 10.0) -> int:
    """Start sshd (it daemonizes) in the host's netns, UTS namespace and cgroups; return its pid."""
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    check_config(config)
    # Inside the new UTS namespace the host's name goes to /proc/sys/kernel/hostname, then exec sshd.
    script = 'echo "$1" > /proc/sys/kernel/hostname && exec "$2" -f "$3" -E "$4"'
    argv = [tool("ip"), "netns", "exec", netns, tool("unshare"), "--uts", "--", "sh", "-c", script,
            "sh", hostname, tool("sshd"), str(config), str(log)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                            preexec_fn=lambda: cgroups.enter(cgroup_dirs))
    if result.returncode != 0:
        raise LabCommandFailed(f"sshd for {hostname} did not start: {result.stderr.strip() or _tail(log)}")
    return wait_for_pid_file(pid_file, timeout_s, f"sshd for {hostname}", log)


def wait_for_pid_file(pid_file: Path, timeout_s: float, what: str, log: Path) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            time.sleep(0.02)
    raise LabCommandFailed(f"{what} did not come up within {timeout_s:g} s: {_tail(log)}")


def _tail(log: Path) -> str:
    try:
        lines = log.read_text().strip().splitlines()
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"


def banner(address: str, port: int = 22, timeout_s: float = 2.0) -> str | None:
    """The SSH server's identification line, or None when nothing answers.

    Callers make sure `address` is a lab address routed to a lab bridge (network.route_is_lab).
    """
    try:
        with socket.create_connection((address, port), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            line = s.recv(256).split(b"\r\n")[0].decode(errors="replace")
            return line if line.startswith("SSH-") else None
    except OSError:
        return None


def wait_for_banner(address: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if banner(address, timeout_s=1.0):
            return
        time.sleep(0.05)
    raise LabCommandFailed(f"sshd on {address} does not answer after {timeout_s:g} s")


def ssh_config_text(hosts: list[tuple[str, str]], identity_file: str, known_hosts: str) -> str:
    """An OpenSSH client config so that people can `ssh -F FILE HOST` with checking on."""
    blocks = []
    for name, address in hosts:
        blocks.append("\n".join([
            f"Host {name} {address}",
            f"  HostName {address}",
            "  User root",
            f"  IdentityFile {identity_file}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {known_hosts}",
            "  StrictHostKeyChecking yes",
            "",
        ]))
    return "\n".join(blocks)
