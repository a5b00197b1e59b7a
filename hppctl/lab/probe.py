"""Small workloads that run ON a lab host (over SSH) to measure what the lab emulates.

    python -m hppctl.lab.probe recv --bind ADDR --peer SRC --port P    # count bytes until SRC's sender closes
    python -m hppctl.lab.probe send --to ADDR --port P --seconds S
    python -m hppctl.lab.probe echo --bind ADDR --peer SRC --port P --count N  # answer N+1 bytes (for ping)
    python -m hppctl.lab.probe ping --to ADDR --port P --count N
    python -m hppctl.lab.probe spin --iterations N              # fixed CPU-bound work, timed
    python -m hppctl.lab.probe hog --bytes B                    # allocate and touch B bytes

Each prints one JSON line. Standard library only: hosts run it with the lab machine's Python
(hppctl.profiling.netprobe, whose servers recv and echo reuse, is standard library only too).

The servers listen on a lab address, which only this machine and its labs can reach, but any user
of this machine can: like the profiler's link server, they take a connection only from the
sender's address (`--peer`; others are closed at once and counted in `refused`), end a transfer at
its deadline (`--timeout` after the connection) and answer at most `--count` + 1 pings, so another
user's traffic can neither take nor prolong a measurement. No token: these are test and bench
workloads, and a token on a command line is visible to this machine's users anyway.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from hppctl.profiling import netprobe


def _serve_one(address: str, peer: str, port: int, timeout_s: float, step) -> dict:
    """Listen on `address` (exactly: a lab address is always the host's own), take one connection
    from `peer` within `timeout_s`, and run `step(conn, deadline)` on it with as long again."""
    server, _ = netprobe.listen(address, port, any_address=False)
    gate = netprobe.Gate(netprobe.prober_address(peer))
    with server:
        with gate.accept(server, time.monotonic() + timeout_s) as conn:
            return {**step(conn, time.monotonic() + timeout_s), "refused": gate.refused.count}


def recv(address: str, peer: str, port: int, timeout_s: float) -> dict:
    """Bytes received from `peer`, over how long, and the goodput (netprobe.steady_rate)."""
    return _serve_one(address, peer, port, timeout_s, netprobe.receive)


def send(address: str, port: int, seconds: float) -> dict:
    with netprobe.connect(address, port, 10.0) as conn:
        record = netprobe.stream(conn, seconds, time.monotonic() + seconds + 30.0)
    return {"bytes": record["bytes"], "seconds": record["seconds"]}


def echo(address: str, peer: str, port: int, count: int, timeout_s: float) -> dict:
    """Answer `peer`'s pings: `count` and the warm-up, at most."""
    return _serve_one(address, peer, port, timeout_s, lambda conn, deadline: netprobe.echo(conn, deadline, count + 1))


def ping(address: str, port: int, count: int) -> dict:
    """Round trips of one byte over TCP (no ICMP needed); the first is a warm-up and is dropped."""
    with netprobe.connect(address, port, 10.0) as conn:
        rtts = netprobe.ping(conn, count)["rtt_s"]
    return {"count": len(rtts), "median_s": statistics.median(rtts), "min_s": min(rtts), "max_s": max(rtts)}


def spin(iterations: int) -> dict:
    """A fixed amount of single-threaded CPU work; wall time is what a slower CPU stretches."""
    start, cpu_start = time.perf_counter(), time.process_time()
    acc = 0
    for i in range(iterations):
        acc = (acc + i * i) % 1_000_003
    return {"iterations": iterations, "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu_start, "checksum": acc}


def hog(total_bytes: int, step: int = 16 << 20) -> dict:
    """Allocate and touch memory in steps, reporting progress; beyond the limit the kernel kills us."""
    held = []
    while len(held) * step < total_bytes:
        held.append(b"\x01" * step)  # a filled bytes object: every page is really touched
        print(json.dumps({"allocated_bytes": len(held) * step}), flush=True)
    return {"allocated_bytes": len(held) * step, "survived": True}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hppctl.lab.probe")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("recv", "echo"):
        s = sub.add_parser(name)
        s.add_argument("--bind", required=True)
        s.add_argument("--peer", required=True, help="the sender's address: connections from others are refused")
        s.add_argument("--port", type=int, required=True)
        s.add_argument("--timeout", type=float, default=30.0)
        if name == "echo":
            s.add_argument("--count", type=int, default=30, help="pings to answer (and one warm-up)")
    s = sub.add_parser("send")
    s.add_argument("--to", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--seconds", type=float, default=5.0)
    s = sub.add_parser("ping")
    s.add_argument("--to", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--count", type=int, default=30)
    s = sub.add_parser("spin")
    s.add_argument("--iterations", type=int, required=True)
    s = sub.add_parser("hog")
    s.add_argument("--bytes", type=int, required=True)
    a = p.parse_args(argv)
    try:
        result = _run(a)
    except (netprobe.LinkFailure, OSError) as e:  # a refused, late or broken transfer: one line, no traceback
        print(json.dumps({"error": f"{e.__class__.__name__}: {e}"}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


def _run(a: argparse.Namespace) -> dict:
    if a.cmd == "recv":
        return recv(a.bind, a.peer, a.port, a.timeout)
    if a.cmd == "echo":
        return echo(a.bind, a.peer, a.port, a.count, a.timeout)
    if a.cmd == "send":
        return send(a.to, a.port, a.seconds)
    if a.cmd == "ping":
        return ping(a.to, a.port, a.count)
    if a.cmd == "spin":
        return spin(a.iterations)
    return hog(a.bytes)


if __name__ == "__main__":
    sys.exit(main())
