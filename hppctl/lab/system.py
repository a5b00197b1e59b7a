"""Running the operating system's tools (ip, tc, iptables, ssh-keygen) and checking they exist.

Every lab module goes through `sh()` so that a failing command becomes one typed error naming the
command and the tool's own complaint, and so that the checks for root and for missing tools are
made once, before anything is created.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from hppctl.errors import BadInput, RuntimeFailure

# Where Debian puts administrator tools; a non-login root shell may not have them on PATH.
_SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")


class LabCommandFailed(RuntimeFailure):
    """A system command the lab needed failed (exit 1): the message has the command and its stderr."""


@dataclass(frozen=True)
class Tool:
    command: str
    package: str
    why: str


BASE_TOOLS = (
    Tool("ip", "iproute2", "network namespaces, veth pairs and the lab bridge"),
    Tool("tc", "iproute2", "bandwidth shaping"),
    Tool("sshd", "openssh-server", "an SSH server per host"),
    Tool("ssh-keygen", "openssh-client", "host keys and the lab's user key"),
    Tool("unshare", "util-linux", "a hostname per host"),
)
DELAY_LINE_TOOL = Tool("iptables", "iptables", "the NFQUEUE delay line (kernel without netem)")


def which(command: str) -> str | None:
    """Absolute path of `command` on PATH or in the sbin directories, else None."""
    found = shutil.which(command)
    if found:
        return found
    for directory in _SBIN:
        candidate = os.path.join(directory, command)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def tool(command: str) -> str:
    path = which(command)
    if path is None:
        raise BadInput(f"{command} is not installed")
    return path


def is_root() -> bool:
    return os.geteuid() == 0


def require(action: str, tools: tuple[Tool, ...] = BASE_TOOLS, need_root: bool = True) -> None:
    """Raise one BadInput line that says everything missing and how to install it."""
    problems = []
    if need_root and not is_root():
        problems.append("root (network namespaces, tc and cgroups need it): run it as root, e.g. with sudo")
    missing = [t for t in tools if which(t.command) is None]
    if missing:
        names = ", ".join(f"{t.command} ({t.why})" for t in missing)
        packages = " ".join(dict.fromkeys(t.package for t in missing))
        problems.append(f"{names}: install with `apt-get install {packages}` "
                        f"(or `bash scripts/install-system-deps.sh`)")
    if problems:
        raise BadInput(f"{action} needs " + "; and ".join(problems))


def sh(argv: list[str], *, check: bool = True, input: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a command (first word resolved through `which`); raise LabCommandFailed when `check`."""
    exe = which(argv[0]) or argv[0]
    try:
        proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, input=input, timeout=timeout)
    except FileNotFoundError:
        raise BadInput(f"{argv[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise LabCommandFailed(f"`{' '.join(argv)}` did not finish within {timeout:g} s") from None
    if check and proc.returncode != 0:
        complaint = (proc.stderr or proc.stdout).strip().splitlines()
        raise LabCommandFailed(f"`{' '.join(argv)}` failed: {complaint[-1] if complaint else f'exit {proc.returncode}'}")
    return proc


def in_netns(netns: str, argv: list[str]) -> list[str]:
    """The command line that runs `argv` inside network namespace `netns`."""
    return ["ip", "netns", "exec", netns, *argv]
