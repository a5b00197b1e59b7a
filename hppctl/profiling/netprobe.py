"""Link measurement ON the devices: an iperf-like TCP transfer and a one-byte ping-pong.

Standard library only. The orchestrator (links.py) starts a server kind on one device, then the
matching client kind on the other, one pair at a time. A whole link is one pair of launches:

    link-serve --args {"bind": ADDR, "peer": PROBER, "token": HEX, "port": P, "seconds": S, "count": N,
                       "timeout_s": T}
        -> {"type": "recv", ...} (client -> server), {"type": "send", ...}, {"type": "echo", ...}
    link-test  --args {"to": ADDR, "token": HEX, "port": P, "seconds": S, "count": N}
        -> {"type": "send", ...}, {"type": "recv", ...} (server -> client), {"type": "ping", ...}

over three connections the client opens in turn: it streams to the server for S seconds (the
server measures), the server streams back for S seconds (the client measures), then N one-byte
round trips. (Each launch costs a device ~1 s of SSH session and interpreter start-up on a
0.25-core host: a link used to take six, one server and one client per measurement.) The records:
recv {bytes, seconds, bytes_per_s, bound}, send {bytes, seconds}, echo {echoed}, ping {rtt_s}; the
server's records also carry `refused`, the connections it has turned away so far.

Every byte from the network is hostile (docs/security.md). The server takes a step only on a
connection from the prober's address (`peer`) whose first bytes are the measurement's `token` (a
fresh random one per link, given to both ends on their command lines, so a user of either device
can read it in `ps` for the seconds the link takes: it keeps out the network, not co-tenants); any
other connection is closed at once and counted, and does not use up a step. Each step has one deadline (its seconds
plus the timeout, not a timeout per read), readings are kept in a fixed-size list, and the echo
answers at most `count` + 1 round trips: a peer that never stops sending gets a one-line error,
not a server that grows or runs forever.

Servers bind the device's own address (the one its peers use), so the traffic takes the path a
training run would; if that address is not local to the device (NAT, an SSH alias resolving
elsewhere), they bind every address instead and say so (`bound`): the port is then open on every
interface for the measurement, and the peer and token checks are what keep strangers out (refusing
would break measuring through NAT, which worked before). The receiver's goodput is the
slope of the bytes it has read against the time it read them, past the transfer's first tenth
(`steady_rate`), so connection set-up, the sender's start-up and TCP's slow start are not counted.
"""

from __future__ import annotations

import hmac
import socket
import time
from collections.abc import Iterator
from typing import Any

CHUNK = 1 << 18
MAX_READINGS = 4096
"""Readings kept per transfer. A 2-second transfer on loopback is tens of thousands of reads; the
slope over 4096 of them spread evenly over the transfer is the same to well under 1 % (thinning a
modelled 0.25-core receiver's readings to 64 moved it by at most 0.26 %, to 256 by 0.04 %)."""
HANDSHAKE_S = 5.0
"""How long an accepted connection from the prober's address may take to send the token (the
prober sends it at once): a silent one cannot hold a step for longer."""
SHOWN_REFUSALS = 4
"""Refused addresses named in an error line (the count is kept whatever arrives)."""


class LinkFailure(Exception):
    """A link measurement that could not be made; the message is the one line the profile reports."""


class Readings:
    """A receiver's (time, bytes so far) readings, at most `limit` of them (+ the latest), spread
    evenly over the whole transfer: when the list fills, every other reading is dropped and from
    then on only every other one is kept. The first and the latest reading are always there, so
    `steady_rate` sees the transfer's whole span, and memory stays the same however long a peer sends."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = max(2, limit or MAX_READINGS)
        self.kept: list[tuple[float, int]] = []
        self.latest: tuple[float, int] | None = None
        self.seen = 0
        self.stride = 1

    def add(self, t: float, total: int) -> None:
        self.latest = (t, total)
        if self.seen % self.stride == 0:
            self.kept.append(self.latest)
            if len(self.kept) >= self.limit:
                self.kept = self.kept[::2]  # kept[i] was reading i*stride: the rest are multiples of 2*stride
                self.stride *= 2
        self.seen += 1

    def points(self) -> list[tuple[float, int]]:
        if self.latest is None or (self.kept and self.kept[-1] is self.latest):
            return list(self.kept)
        return self.kept + [self.latest]


class Refusals:
    """Connections turned away: their count and the first few addresses (bounded, whatever arrives)."""

    def __init__(self) -> None:
        self.count = 0
        self.addresses: list[str] = []

    def add(self, address: str) -> None:
        self.count += 1
        if address not in self.addresses and len(self.addresses) < SHOWN_REFUSALS:
            self.addresses.append(address)

    def text(self) -> str:
        if not self.count:
            return "no other connection arrived"
        more = " and others" if self.count > len(self.addresses) and len(self.addresses) == SHOWN_REFUSALS else ""
        return f"refused {self.count} connection(s) from {', '.join(self.addresses)}{more}"


class Gate:
    """Who may take a step: a connection from `peer` (an IPv4 address) whose first bytes are `token`
    (when one is set). Anything else is closed at once and counted, and does not use up the step."""

    def __init__(self, peer: str, token: str | None = None) -> None:
        self.peer = peer
        self.token = token.encode("ascii") if token else None
        self.refused = Refusals()

    def accept(self, server: socket.socket, deadline: float) -> socket.socket:
        """The next connection from the prober, or LinkFailure once `deadline` (monotonic) passes."""
        while (left := deadline - time.monotonic()) > 0:
            server.settimeout(left)
            try:
                conn, address = server.accept()
            except TimeoutError:
                break
            if self._admits(conn, address[0], deadline):
                return conn
            conn.close()
            self.refused.add(address[0])
        raise LinkFailure(f"no connection from the prober {self.peer} before the deadline ({self.refused.text()})")

    def _admits(self, conn: socket.socket, address: str, deadline: float) -> bool:
        if address != self.peer:
            return False  # not a byte is read from a stranger
        if self.token is None:
            return True
        try:
            got = read_exactly(conn, len(self.token), min(deadline, time.monotonic() + HANDSHAKE_S))
        except OSError:  # reset, or silent past the handshake: a stranger too
            return False
        return hmac.compare_digest(got, self.token)  # bytes against bytes: any input compares


def read_exactly(conn: socket.socket, size: int, deadline: float) -> bytes:
    """Up to `size` bytes, fewer if the peer closes first; TimeoutError past `deadline`."""
    got = b""
    while len(got) < size:
        conn.settimeout(max(1e-3, deadline - time.monotonic()))
        data = conn.recv(size - len(got))
        if not data:
            break
        got += data
    return got


def prober_address(peer: str) -> str:
    """The prober's address as the server's accept() reports it (the orchestrator may pass a name)."""
    try:
        return socket.gethostbyname(peer)
    except OSError:
        raise LinkFailure(f"cannot resolve the prober's address {peer!r}") from None


def time_left(deadline: float, what: str) -> float:
    """Seconds until `deadline` (monotonic), or LinkFailure saying `what` was still going on."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise LinkFailure(f"{what} at the step's deadline; closed")
    return left


def listen(address: str, port: int, any_address: bool = True) -> tuple[socket.socket, str]:
    """A listening socket on `address`, or on every address if it is not this device's and
    `any_address` (NAT, an SSH alias resolving elsewhere); (socket, the address bound)."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind((address, port))
        bound = address
    except OSError as e:
        if e.errno != 99 or not any_address:  # 99 EADDRNOTAVAIL: the address is not this device's
            server.close()
            raise
        server.bind(("0.0.0.0", port))
        bound = "0.0.0.0"
    server.listen(8)  # strangers queued ahead of the prober do not push it out of the backlog
    return server, bound


def connect(address: str, port: int, timeout_s: float) -> socket.socket:
    """Connect, retrying while the peer's listener is not up yet (refusals are answered at once)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return socket.create_connection((address, port), timeout=timeout_s)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


SILENT_S = 0.5
"""A sender from which nothing came for this long before the deadline went silent; one heard from more
recently was still sending (the read that spans the deadline times out either way: its timeout is the
time left, and it may have begun between two of a sender's bursts, or while the machine paused it)."""


def receive(conn: socket.socket, deadline: float) -> dict[str, Any]:
    """Read until the sender shuts its side: the `recv` record (closing tells the sender all arrived).
    A sender still sending, or silent, at `deadline` (monotonic) is a LinkFailure."""
    total, readings = 0, Readings()
    heard = time.monotonic()
    while True:
        conn.settimeout(time_left(deadline, f"the sender was still sending ({total} bytes so far)"))
        try:
            data = conn.recv(CHUNK)
        except TimeoutError:
            raise deadline_failure(total, time.monotonic() - heard) from None
        if not data:
            break
        heard = time.monotonic()
        total += len(data)
        readings.add(time.perf_counter(), total)
    points = readings.points()
    seconds = points[-1][0] - points[0][0] if points else 0.0
    return {"type": "recv", "bytes": total, "seconds": seconds, "bytes_per_s": steady_rate(points)}


def deadline_failure(total: int, quiet_s: float) -> LinkFailure:
    """What a receive that reached the deadline says: silent or still sending (SILENT_S)."""
    if quiet_s >= SILENT_S:
        return LinkFailure(f"the sender went silent without closing ({total} bytes so far, nothing for the last "
                           f"{quiet_s:.1f} s)")
    return LinkFailure(f"the sender was still sending ({total} bytes so far) at the step's deadline; closed")


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


def stream(conn: socket.socket, seconds: float, deadline: float) -> dict[str, Any]:
    """Send for `seconds`, then wait for the receiver to close (every byte has arrived): the `send` record."""
    payload = b"\x5a" * CHUNK
    start, total = time.perf_counter(), 0
    try:
        while time.perf_counter() - start < seconds:
            conn.settimeout(time_left(deadline, "the receiver was still reading"))
            conn.sendall(payload)
            total += len(payload)
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(time_left(deadline, "the receiver had not closed"))
        conn.recv(1)  # the receiver closes once every byte has arrived
    except TimeoutError:
        raise LinkFailure(f"the receiver stopped reading ({total} bytes sent)") from None
    return {"type": "send", "bytes": total, "seconds": time.perf_counter() - start}


def echo(conn: socket.socket, deadline: float, most: int) -> dict[str, Any]:
    """Answer each message with itself, at most `most` times and until `deadline`: the `echo` record."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    count = 0
    while count < most and (left := deadline - time.monotonic()) > 0:
        conn.settimeout(left)
        try:
            data = conn.recv(64)
        except TimeoutError:
            break
        if not data:
            break
        conn.sendall(data)
        count += 1
    return {"type": "echo", "echoed": count}


def ping(conn: socket.socket, count: int) -> dict[str, Any]:
    """One-byte TCP round trips (no ICMP needed); the first is a warm-up and is dropped."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(count + 1):
        t = time.perf_counter()
        conn.sendall(b"p")
        if not conn.recv(64):
            raise LinkFailure(f"the echo server closed after {len(rtts)} round trips")
        rtts.append(time.perf_counter() - t)
    return {"type": "ping", "rtt_s": rtts[1:]}


def link_serve(args: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The server side of a whole link: receive, send back, echo (three connections from the prober,
    in that order; other connections are refused and counted, module docstring)."""
    timeout_s, seconds = float(args.get("timeout_s", 30)), float(args.get("seconds", 2.0))
    round_trips = int(args.get("count", 20)) + 1  # the warm-up too
    gate = Gate(prober_address(args["peer"]), args.get("token"))
    steps = (receive, lambda conn, deadline: stream(conn, seconds, deadline),
             lambda conn, deadline: echo(conn, deadline, round_trips))
    server, bound = listen(args["bind"], int(args["port"]))
    with server:
        yield {"type": "listening", "bound": bound, "port": int(args["port"])}
        for step in steps:
            with gate.accept(server, time.monotonic() + timeout_s) as conn:
                record = step(conn, time.monotonic() + seconds + timeout_s)
            yield {**record, "bound": bound, "refused": gate.refused.count}


def link_test(args: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The client side of a whole link: send, receive, ping (each on a connection of its own, each
    opened with the measurement's token)."""
    address, port, timeout_s = args["to"], int(args["port"]), float(args.get("timeout_s", 10))
    seconds, hello = float(args.get("seconds", 2.0)), str(args.get("token") or "").encode("ascii")
    try:
        with connect(address, port, timeout_s) as conn:
            conn.sendall(hello)
            yield stream(conn, seconds, time.monotonic() + seconds + timeout_s)
        with connect(address, port, timeout_s) as conn:
            conn.sendall(hello)
            record = receive(conn, time.monotonic() + seconds + timeout_s)
            yield {**record, "bound": conn.getsockname()[0]}  # the address the bytes came to
        with connect(address, port, timeout_s) as conn:
            conn.sendall(hello)
            yield ping(conn, int(args.get("count", 20)))
    except (BrokenPipeError, ConnectionResetError):
        # Said here: the probe's main would take a BrokenPipeError for its own stdout and stop silently.
        raise LinkFailure(f"the server at {address}:{port} closed the connection (it refuses connections "
                          "from any address but the prober's it was given, and without the token)") from None
