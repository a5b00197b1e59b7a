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

import math
import os

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
