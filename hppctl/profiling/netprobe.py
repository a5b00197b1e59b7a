"""Link measurement ON the devices: an iperf-like TCP transfer and a one-byte ping-pong.

Standard library only. The orchestrator (links.py) starts a server kind on one device, then the
matching client kind on the other, one pair at a time. A whole link is one pair of launches:

    link-serve --args {"bind": ADDR, "port": P, "seconds": S, "timeout_s": T}
        -> {"type": "recv", ...} (client -> server), {"type": "send", ...}, {"type": "echo", ...}
    link-test  --args {"to": ADDR, "port": P, "seconds": S, "count": N}
        -> {"type": "send", ...}, {"type": "recv", ...} (server -> client), {"type": "ping", ...}

over three connections the client opens in turn: it streams to the server for S seconds (the
server measures), the server streams back for S seconds (the client measures), then N one-byte
round trips. (Each launch costs a device ~1 s of SSH session and interpreter start-up on a
0.25-core host: a link used to take six, one server and one client per measurement.) The records:
recv {bytes, seconds, bytes_per_s, bound}, send {bytes, seconds}, echo {echoed}, ping {rtt_s}.

Servers bind the device's own address (the one its peers use), so the traffic takes the path a
training run would; if that address is not local to the device (NAT, an SSH alias resolving
elsewhere), they bind every address instead and say so (`bound`). The receiver's goodput is the
slope of the bytes it has read against the time it read them, past the transfer's first tenth
(`steady_rate`), so connection set-up, the sender's start-up and TCP's slow start are not counted.
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


def _receive(conn: socket.socket) -> dict[str, Any]:
    """Read until the sender shuts its side: the `recv` record (closing tells the sender all arrived)."""
    total, readings = 0, []
    while data := conn.recv(CHUNK):
        total += len(data)
        readings.append((time.perf_counter(), total))
    seconds = readings[-1][0] - readings[0][0] if readings else 0.0
    return {"type": "recv", "bytes": total, "seconds": seconds, "bytes_per_s": steady_rate(readings)}


def steady_rate(readings: list[tuple[float, int]], ramp: float = 0.1) -> float:
    """Bytes per second from the receiver's (time, bytes so far) readings: the least-squares slope
    over every reading after the first `ramp` of the transfer's time (TCP's slow start).

    It used to be (bytes after the first reading) / (last - first reading), which two readings
    decide. A receiver on a CPU-throttled device is stopped for the rest of each CFS period (75 ms
    of every 100 ms at 0.25 core); the bytes wait in the socket buffer and the readings after a
    stop are on time again, but a transfer whose last bytes arrive during a stop is read up to
    75 ms late: a 1-second transfer between lab hosts read 89.7 Mbit/s where the link gives 95.6.
    A fit over all readings is moved by one late reading by well under 1 %."""
    if len(readings) < 2:
        return 0.0
    start = readings[0][0] + ramp * (readings[-1][0] - readings[0][0])
    steady = [r for r in readings if r[0] >= start]
    if len(steady) < 3:  # too few readings for a slope: the whole transfer's average
        steady = readings
    n = len(steady)
    mean_t = sum(t for t, _ in steady) / n
    mean_b = sum(b for _, b in steady) / n
    spread = sum((t - mean_t) ** 2 for t, _ in steady)
    if spread <= 0:
        return 0.0
    return max(0.0, sum((t - mean_t) * (b - mean_b) for t, b in steady) / spread)


def _stream(conn: socket.socket, seconds: float) -> dict[str, Any]:
    """Send for `seconds`, then wait for the receiver to close (every byte has arrived): the `send` record."""
    payload = b"\x5a" * CHUNK
    start, total = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        conn.sendall(payload)
        total += len(payload)
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)  # the receiver closes once every byte has arrived
    return {"type": "send", "bytes": total, "seconds": time.perf_counter() - start}


def _echo(conn: socket.socket) -> dict[str, Any]:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    count = 0
    while data := conn.recv(64):
        conn.sendall(data)
        count += 1
    return {"type": "echo", "echoed": count}


def _ping(conn: socket.socket, count: int) -> dict[str, Any]:
    """One-byte TCP round trips (no ICMP needed); the first is a warm-up and is dropped."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(count + 1):
        t = time.perf_counter()
        conn.sendall(b"p")
        conn.recv(64)
        rtts.append(time.perf_counter() - t)
    return {"type": "ping", "rtt_s": rtts[1:]}


def link_serve(args: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The server side of a whole link: receive, send back, echo (three connections, in that order)."""
    timeout_s = float(args.get("timeout_s", 30))
    server, bound = _listen(args["bind"], int(args["port"]), timeout_s)
    with server:
        yield {"type": "listening", "bound": bound, "port": int(args["port"])}
        for step in (_receive, lambda conn: _stream(conn, float(args.get("seconds", 2.0))), _echo):
            conn, _ = server.accept()
            conn.settimeout(timeout_s)
            with conn:
                yield {**step(conn), "bound": bound}


def link_test(args: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The client side of a whole link: send, receive, ping (each on a connection of its own)."""
    address, port, timeout_s = args["to"], int(args["port"]), float(args.get("timeout_s", 10))
    seconds = float(args.get("seconds", 2.0))
    with _connect(address, port, timeout_s) as conn:
        yield _stream(conn, seconds)
    with _connect(address, port, timeout_s) as conn:
        conn.settimeout(seconds + timeout_s)
        yield {**_receive(conn), "bound": conn.getsockname()[0]}  # the address the bytes came to
    with _connect(address, port, timeout_s) as conn:
        yield _ping(conn, int(args.get("count", 20)))
