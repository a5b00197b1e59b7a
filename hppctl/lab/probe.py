"""Small workloads that run ON a lab host (over SSH) to measure what the lab emulates.

    python -m hppctl.lab.probe recv --bind ADDR --port P        # count bytes until the sender closes
    python -m hppctl.lab.probe send --to ADDR --port P --seconds S
    python -m hppctl.lab.probe echo --bind ADDR --port P        # answer each byte (for ping)
    python -m hppctl.lab.probe ping --to ADDR --port P --count N
    python -m hppctl.lab.probe spin --iterations N              # fixed CPU-bound work, timed
    python -m hppctl.lab.probe hog --bytes B                    # allocate and touch B bytes

Each prints one JSON line. Standard library only: hosts run it with the lab machine's Python.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time

CHUNK = 1 << 20


def _listen(address: str, port: int, timeout_s: float) -> socket.socket:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, port))
    server.listen(1)
    server.settimeout(timeout_s)
    return server


def _connect(address: str, port: int, timeout_s: float) -> socket.socket:
    """Connect, retrying while the peer's listener is not up yet (refusals are answered at once)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return socket.create_connection((address, port), timeout=timeout_s)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def recv(address: str, port: int, timeout_s: float) -> dict:
    """Bytes received and the time from the first to the last byte."""
    with _listen(address, port, timeout_s) as server:
        conn, _ = server.accept()
        conn.settimeout(timeout_s)
        total, first, last = 0, None, None
        while data := conn.recv(CHUNK):
            last = time.monotonic()
            first = first or last
            total += len(data)
        conn.close()
    seconds = (last - first) if first is not None else 0.0
    return {"bytes": total, "seconds": seconds, "bytes_per_s": total / seconds if seconds else 0.0}


def send(address: str, port: int, seconds: float) -> dict:
    payload = b"\x5a" * CHUNK
    with _connect(address, port, 10.0) as conn:
        start, total = time.monotonic(), 0
        while time.monotonic() - start < seconds:
            conn.sendall(payload)
            total += len(payload)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)  # wait for the receiver to close: every byte has arrived
    return {"bytes": total, "seconds": time.monotonic() - start}


def echo(address: str, port: int, timeout_s: float) -> dict:
    with _listen(address, port, timeout_s) as server:
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        count = 0
        while data := conn.recv(64):
            conn.sendall(data)
            count += 1
    return {"echoed": count}


def ping(address: str, port: int, count: int) -> dict:
    """Round trips of one byte over TCP (no ICMP needed); the first is a warm-up and is dropped."""
    rtts = []
    with _connect(address, port, 10.0) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count + 1):
            t = time.perf_counter()
            conn.sendall(b"p")
            conn.recv(64)
            rtts.append(time.perf_counter() - t)
    rtts = rtts[1:]
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
        s.add_argument("--port", type=int, required=True)
        s.add_argument("--timeout", type=float, default=30.0)
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
    if a.cmd == "recv":
        result = recv(a.bind, a.port, a.timeout)
    elif a.cmd == "echo":
        result = echo(a.bind, a.port, a.timeout)
    elif a.cmd == "send":
        result = send(a.to, a.port, a.seconds)
    elif a.cmd == "ping":
        result = ping(a.to, a.port, a.count)
    elif a.cmd == "spin":
        result = spin(a.iterations)
    else:
        result = hog(a.bytes)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
