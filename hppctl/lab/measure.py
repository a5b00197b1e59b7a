"""Measuring a lab from the outside, as a user would: probes started over SSH with fabric.

Used by the lab tests and by bench/lab_check.py. Every address is checked to be routed to a lab
bridge before anything connects to it, so a measurement can never send traffic off this machine.
"""

from __future__ import annotations

import json
import shlex

from hppctl.errors import BadInput, RuntimeFailure
from hppctl.lab import network
from hppctl.ssh import connect
from hppctl.models.cluster import ClusterSpec

PROBE = "-m hppctl.lab.probe"


def _address(cluster: ClusterSpec, name: str) -> str:
    device = cluster.device(name)
    if device.host is None or not network.route_is_lab(device.host):
        raise BadInput(f"device {name!r} ({device.host}) is not a host of a lab that is up")
    return device.host


def _python(cluster: ClusterSpec, name: str) -> str:
    return shlex.quote(cluster.device(name).python or "python3")


def _last_json(text: str) -> dict:
    lines = [line for line in text.strip().splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeFailure(f"probe printed no result: {text.strip()[-200:]!r}")
    return json.loads(lines[-1])


def run_probe(cluster: ClusterSpec, host: str, args: str, warn: bool = False):
    _address(cluster, host)
    return connect(cluster, host).run(f"{_python(cluster, host)} {PROBE} {args}", hide=True, warn=warn, in_stream=False)


def bandwidth(cluster: ClusterSpec, src: str, dst: str, seconds: float = 5.0, port: int = 5201) -> dict:
    """Goodput of one TCP stream from `src` to `dst`, measured by the receiver (bytes/s)."""
    dst_addr, src_addr = _address(cluster, dst), _address(cluster, src)
    receiver = connect(cluster, dst).run(
        f"{_python(cluster, dst)} {PROBE} recv --bind {dst_addr} --peer {src_addr} --port {port} --timeout {seconds + 20}",
        hide=True, asynchronous=True, in_stream=False)
    run_probe(cluster, src, f"send --to {dst_addr} --port {port} --seconds {seconds}")
    return _last_json(receiver.join().stdout)


def rtt(cluster: ClusterSpec, a: str, b: str, count: int = 30, port: int = 5202) -> dict:
    """Median TCP round trip of one byte from `a` to `b` and back (seconds)."""
    a_addr, b_addr = _address(cluster, a), _address(cluster, b)
    server = connect(cluster, b).run(
        f"{_python(cluster, b)} {PROBE} echo --bind {b_addr} --peer {a_addr} --port {port} --count {count}",
        hide=True, asynchronous=True, in_stream=False)
    result = _last_json(run_probe(cluster, a, f"ping --to {b_addr} --port {port} --count {count}").stdout)
    server.join()
    return result


def cpu_time(cluster: ClusterSpec, host: str, iterations: int) -> dict:
    """Wall time of a fixed CPU-bound workload on `host`."""
    return _last_json(run_probe(cluster, host, f"spin --iterations {iterations}").stdout)


def allocate(cluster: ClusterSpec, host: str, total_bytes: int) -> dict:
    """Allocate `total_bytes` on `host`: {'exit': code, 'allocated_bytes': last reported, 'killed': bool}."""
    result = run_probe(cluster, host, f"hog --bytes {total_bytes}", warn=True)
    progress = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    allocated = max((p.get("allocated_bytes", 0) for p in progress), default=0)
    survived = any(p.get("survived") for p in progress)
    # Killed by SIGKILL: the shell reports 137, or SSH reports the signal (fabric: exit -1).
    return {"exit": result.exited, "allocated_bytes": allocated, "killed": not survived and result.exited != 0}
