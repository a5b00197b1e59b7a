"""Link measurement ON the devices: an iperf-like TCP transfer and a one-byte ping-pong.

Standard library only. The orchestrator (remote.py / cluster.py) starts a server kind on one
device, then the matching client kind on the other, one pair at a time:

    recv  --args {"bind": ADDR, "port": P, "timeout_s": T}     -> {"type": "recv", "bytes", "seconds", "bytes_per_s"}
    send  --args {"to": ADDR, "port": P, "seconds": S}         -> {"type": "send", "bytes", "seconds"}
    echo  --args {"bind": ADDR, "port": P, "timeout_s": T}     -> {"type": "echo", "echoed"}
    ping  --args {"to": ADDR, "port": P, "count": N}           -> {"type": "ping", "rtt_s": [...]}

Servers bind the device's own address (the one its peers use), so the traffic takes the path a
training run would; if that address is not local to the device (NAT, an SSH alias resolving
elsewhere), they bind every address instead and say so (`bound`). The receiver times from the
first to the last byte, so connection set-up and the sender's start-up are not counted.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

CHUNK = 1 << 18


def _listen(address: str, port: int, timeout_s: float) -> tuple[socket.socket, str]:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind((address, port))
        bound = address
    except OSError as e:
        if e.errno != 99:  # EADDRNOTAVAIL: the address is not this device's
            server.close()
            raise
        server.bind(("0.0.0.0", port))
        bound = "0.0.0.0"
    server.listen(1)
    server.settimeout(timeout_s)
    return server, bound


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


def recv(args: dict[str, Any]) -> Iterator[dict[str, Any]]:
    server, bound = _listen(args["bind"], int(args["port"]), float(args.get("timeout_s", 30)))
    with server:
        yield {"type": "listening", "bound": bound, "port": int(args["port"])}
        conn, _ = server.accept()
        conn.settimeout(float(args.get("timeout_s", 30)))
        total, first, last = 0, None, None
        with conn:
            while data := conn.recv(CHUNK):
                last = time.perf_counter()
                if first is None:
                    first, total = last, 0  # the first chunk only starts the clock
                else:
                    total += len(data)
    seconds = (last - first) if first is not None and last is not None else 0.0
    yield {"type": "recv", "bound": bound, "bytes": total, "seconds": seconds,
           "bytes_per_s": total / seconds if seconds > 0 else 0.0}


def send(args: dict[str, Any]) -> Iterator[dict[str, Any]]:
    payload = b"\x5a" * CHUNK
    seconds = float(args.get("seconds", 2.0))
    with _connect(args["to"], int(args["port"]), float(args.get("timeout_s", 10))) as conn:
        start, total = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            conn.sendall(payload)
            total += len(payload)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)  # the receiver closes once every byte has arrived
    yield {"type": "send", "bytes": total, "seconds": time.perf_counter() - start}


def echo(args: dict[str, Any]) -> Iterator[dict[str, Any]]:
    server, bound = _listen(args["bind"], int(args["port"]), float(args.get("timeout_s", 30)))
    with server:
        yield {"type": "listening", "bound": bound, "port": int(args["port"])}
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        count = 0
        with conn:
            while data := conn.recv(64):
                conn.sendall(data)
                count += 1
    yield {"type": "echo", "bound": bound, "echoed": count}


def ping(args: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One-byte TCP round trips (no ICMP needed); the first is a warm-up and is dropped."""
    rtts = []
    with _connect(args["to"], int(args["port"]), float(args.get("timeout_s", 10))) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(int(args.get("count", 20)) + 1):
            t = time.perf_counter()
            conn.sendall(b"p")
            conn.recv(64)
            rtts.append(time.perf_counter() - t)
    yield {"type": "ping", "rtt_s": rtts[1:]}
