"""Fabric connections to cluster hosts with host-key checking ON.

The one place that builds an SSH connection, below everything that reaches a host: the launcher
(runtime/launch.py), `hppctl check`, the profiler (profiling/remote.py) and the lab's measurements
(lab/measure.py). It lived in `hppctl.lab`, which made the profiler import the lab while the lab's
host probes import the profiler's network probe.

Plain `fabric.Connection` trusts any host key (it installs paramiko's AutoAddPolicy and loads no
known_hosts file). Two lines fix that, and this helper applies them from the cluster file's
`ssh:` section, so callers never connect to a host whose key the lab (or the user) did not vouch for:

    c = fabric.Connection(host, user=user, connect_kwargs={"key_filename": identity_file})
    c.client.load_host_keys(known_hosts)
    c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
"""

from __future__ import annotations

import io
import math
import os
import secrets
import shlex

from hppctl.errors import BadInput
from hppctl.models.cluster import ClusterSpec, DeviceSpec


def connect_timeout(seconds: float) -> int:
    """fabric's connect_timeout (whole seconds) for the cluster's `connect_timeout_s`: rounded up, so
    0.5 s waits 1 s instead of 0 (no wait at all); the cluster file bounds it (models/cluster.py)."""
    return max(1, math.ceil(seconds))


def connection(device: DeviceSpec, ssh_known_hosts: str | None, identity_file: str | None, timeout_s: float = 10.0):
    """A fabric Connection to an SSH device that refuses unknown host keys."""
    import fabric
    import paramiko

    if device.host is None:
        raise BadInput(f"device {device.name!r} has no host to connect to")
    connect_kwargs = {"look_for_keys": identity_file is None}
    if identity_file is not None:
        connect_kwargs["key_filename"] = identity_file
    conn = fabric.Connection(device.host, user=device.user, port=device.port, connect_timeout=connect_timeout(timeout_s),
                             connect_kwargs=connect_kwargs)
    known_hosts = ssh_known_hosts or os.path.expanduser("~/.ssh/known_hosts")
    if os.path.exists(known_hosts):
        conn.client.load_host_keys(known_hosts)
    conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return conn


def connect(cluster: ClusterSpec, name: str):
    """The connection to device `name` of `cluster`, as its `ssh:` section says."""
    try:
        device = cluster.device(name)
    except KeyError:
        raise BadInput(f"cluster {cluster.name!r} has no device {name!r}") from None
    return connection(device, cluster.ssh.known_hosts, cluster.ssh.identity_file, cluster.ssh.connect_timeout_s)


_UNPACK = """\
import os, shutil, sys, tarfile
directory, name, temp = sys.argv[1:4]
os.chdir(directory)
try:
    with tarfile.open(temp + ".tar.gz") as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(temp, filter="data")
        else:
            archive.extractall(temp)
    try:
        os.rename(temp, name)
    except OSError:
        if not os.path.isdir(name):
            raise
finally:
    if os.path.exists(temp + ".tar.gz"):
        os.remove(temp + ".tar.gz")
    shutil.rmtree(temp, ignore_errors=True)
"""
"""Run by the device's Python: unpack the uploaded archive next to its final name, then rename it
there (atomic: a directory of that name is always complete; when another run won the race, its
copy stays and this one is removed)."""


class InstallFailed(Exception):
    """A remote step of `install_cached` failed (its stderr's last line is the message)."""


def install_cached(conn, directory: str, name: str, archive: bytes, python: str) -> int:
    """Make `~/<directory>/<name>/` on the host behind `conn` (an open fabric Connection) hold the
    gzip'd tar `archive`, unless it already exists; returns the bytes sent (0 when it did).

    One shell command asks whether it exists; if not, the archive goes over SFTP on the same SSH
    connection to a temporary name in the same directory, and the device's `python` unpacks and
    renames it (`_UNPACK`). `InstallFailed` when a remote step fails; connection errors propagate."""
    quoted = shlex.quote(name)
    probe = (f'mkdir -p "$HOME"/{shlex.quote(directory)} && cd "$HOME"/{shlex.quote(directory)} && pwd && '
             f'if [ -d {quoted} ]; then echo cached; else echo missing; fi')
    result = conn.run(probe, hide=True, warn=True, in_stream=False)
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    if result.exited != 0 or len(lines) < 2 or lines[-1] not in ("cached", "missing"):
        raise InstallFailed(_last_line(result.stderr) or f"`{probe}` exited {result.exited}")
    absolute, state = lines[-2], lines[-1]  # `pwd`: the cache directory's absolute path, for SFTP
    if state == "cached":
        return 0
    temp = f".{name}.{secrets.token_hex(6)}"
    try:
        conn.sftp().putfo(io.BytesIO(archive), f"{absolute}/{temp}.tar.gz")
    except OSError as e:  # the device's disk is full, the directory not writable
        raise InstallFailed(f"SFTP upload failed: {e.strerror or e}") from None
    except Exception as e:  # noqa: BLE001 - paramiko.SSHException: e.g. an sshd without the sftp subsystem
        raise InstallFailed(f"SFTP upload failed: {e or e.__class__.__name__} (does the device's sshd offer "
                            f"the sftp subsystem?)") from None
    unpack = conn.run(shlex.join([python, "-c", _UNPACK, absolute, name, temp]), hide=True, warn=True, in_stream=False)
    if unpack.exited != 0:  # leave no partial upload behind (the unpacker removes its own when it runs)
        conn.run(shlex.join(["rm", "-rf", f"{absolute}/{temp}.tar.gz", f"{absolute}/{temp}"]), hide=True, warn=True,
                 in_stream=False)
        raise InstallFailed(_last_line(unpack.stderr) or f"{python} exited {unpack.exited}")
    return len(archive)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
