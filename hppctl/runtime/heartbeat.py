"""Heartbeats, acknowledgements and probes between workers and the coordinator (notes/asteroid.md §5).

Wire format: every message is one line of JSON followed by a tab and HMAC-SHA256(token, JSON) in
hex. Heartbeats are UDP datagrams from a worker to the coordinator's address (the only address it
listens on); each valid one is answered with an acknowledgement that carries the coordinator's
*generation* (how many re-plans it has made), which is how a worker learns, without polling, that
it must stop its round and take part in a reconfiguration. A datagram with a missing or wrong
MAC, from a device the run does not know, from an address that is not its device's, or that is not
newer than the device's last beat (a replay), is dropped and counted (`HeartbeatListener.dropped`:
a counter and the last few reasons, so a flood costs no memory).

Every byte that arrives is untrusted: MACs are compared as bytes (`hmac.compare_digest` raises on
non-ASCII str), each message is handled inside its own try, and no listener thread ends on any
input (issue 23: one datagram `x\t\xc3\xa9` used to end the coordinator's listener, and so the run).

A probe is a separate TCP connection from the coordinator to the worker's probe port (announced in
its heartbeats): the coordinator sends a fresh nonce, the worker answers `HMAC(token, probe|nonce|device)`.
A stopped process, a killed one or a cut link cannot answer within the probe timeout. The responder
serves many connections at once from one thread (a selector), each for at most `PROBE_READ_S` and
`MAX_NONCE_BYTES`, and at most `MAX_PROBE_CONNECTIONS` of them (the oldest is closed for a new one):
idle connections held open by anyone cannot keep the coordinator's probe out.

Threads: `HeartbeatSender` and `ProbeResponder` run in the worker beside the training loop;
`HeartbeatListener` runs in the coordinator. All three are daemons with `start`/`stop` pairs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import selectors
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from pydantic import ValidationError

from hppctl.models.beats import Ack, HeartbeatMessage

MAX_DATAGRAM = 2048
"""Longer datagrams are cut to this by recvfrom (and then fail their MAC)."""
MAX_REASON_CHARS = 160
"""A dropped datagram's reason is cut to this (it quotes a device name from the datagram)."""
RECENT_REASONS = 8
"""How many of the latest drop reasons `DropLog` keeps."""
MAX_PROBE_CONNECTIONS = 32
PROBE_READ_S = 1.0
"""How long one probe connection may take to send its nonce."""
MAX_NONCE_BYTES = 64
MAX_REPLY_BYTES = 128
"""The coordinator reads at most this from a probed worker (an answer is 65 bytes)."""
NONCE = re.compile(rb"[0-9a-f]{32}")
"""The coordinator's nonces (secrets.token_hex(16)); the responder answers nothing else."""


def sign(token: str, doc: dict) -> bytes:
    body = json.dumps(doc, separators=(",", ":"), sort_keys=True)
    mac = hmac.new(token.encode(), body.encode(), hashlib.sha256).hexdigest()
    return f"{body}\t{mac}".encode()


def verify(token: str, data: bytes) -> dict | None:
    """The message's JSON object if its MAC checks, else None; never raises, whatever `data` holds.
    Bytes are compared, not str: `hmac.compare_digest` raises TypeError on non-ASCII str."""
    body, tab, mac = data.rpartition(b"\t")
    if not tab or not body:
        return None
    expected = hmac.new(token.encode(), body, hashlib.sha256).hexdigest().encode()
    if not hmac.compare_digest(mac, expected):
        return None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def probe_answer(token: str, nonce: str, device: str) -> str:
    return hmac.new(token.encode(), f"probe|{nonce}|{device}".encode(), hashlib.sha256).hexdigest()


def bounded(text: str, limit: int = MAX_REASON_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


class DropLog:
    """What the coordinator's listener refused: a count and the last few reasons (bounded memory)."""

    def __init__(self) -> None:
        self.count = 0
        self._recent: deque[tuple[int, str]] = deque(maxlen=RECENT_REASONS)
        self._lock = threading.Lock()

    def add(self, reason: str) -> None:
        with self._lock:
            self.count += 1
            self._recent.append((self.count, bounded(reason)))

    def recent(self, after: int = 0) -> list[str]:
        """The latest reasons (at most RECENT_REASONS), oldest first; only those of drops counted
        past `after`."""
        with self._lock:
            return [reason for number, reason in self._recent if number > after]


class _SocketThread:
    """A daemon thread serving `self._sock` through `_serve`: the start/stop pair of the three below."""

    thread_name = "socket"

    def start(self):
        self._running = True
        self._thread = threading.Thread(target=self._serve, daemon=True, name=self.thread_name)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._running = False
        self._thread.join(timeout=2)
        self._sock.close()


# --- the coordinator's side ------------------------------------------------------------------------

@dataclass
class Beat:
    device: str
    address: str
    received_s: float
    """time.monotonic() at the coordinator."""
    message: HeartbeatMessage


@dataclass
class HeartbeatListener(_SocketThread):
    """UDP socket on the coordinator's one address; validated beats queue up for `drain()`."""

    host: str
    token: str
    addresses: dict[str, set[str]]
    """Per device, the addresses its heartbeats may come from."""
    port: int = 0
    generation: int = 0
    dropped: DropLog = field(default_factory=DropLog)
    _beats: list[Beat] = field(default_factory=list)
    _last_seq: dict[str, int] = field(default_factory=dict)
    """Per device, the sequence number of its newest accepted beat: an older or equal one is a replay."""
    _senders: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Where each device's beats come from (address, port): acknowledgements go back there."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> "HeartbeatListener":
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_DGRAM)
        self._sock.bind((self.host, self.port))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        return super().start()

    def drain(self) -> list[Beat]:
        with self._lock:
            beats, self._beats = self._beats, []
        return beats

    def _serve(self) -> None:
        while self._running:
            try:
                data, (address, port, *_) = self._sock.recvfrom(MAX_DATAGRAM)
            except (socket.timeout, OSError):
                continue
            try:
                self._handle(data, address, port)
            except Exception as e:  # a bug on some input must cost that datagram, never the listener
                self._drop(f"from {address}: {e.__class__.__name__} while reading it")

    def _handle(self, data: bytes, address: str, port: int) -> None:
        beat = self.accept(data, address)
        if beat is None:
            return
        with self._lock:
            self._beats.append(beat)
            self._senders[beat.device] = (address, port)
        self._ack((address, port), beat.message.seq)

    def _ack(self, to: tuple[str, int], seq: int) -> None:
        try:
            self._sock.sendto(sign(self.token, Ack(generation=self.generation, seq=seq).model_dump()), to)
        except OSError:
            pass

    def announce(self) -> None:
        """Send the current generation to every device heard from, now rather than with its next ack:
        survivors stop their round up to a heartbeat period sooner."""
        with self._lock:
            senders = list(self._senders.values())
        for to in senders:
            self._ack(to, 0)

    def accept(self, data: bytes, address: str) -> Beat | None:
        """The beat if the datagram is valid; else None, with the reason counted in `dropped`."""
        doc = verify(self.token, data)
        if doc is None:
            return self._drop(f"from {address}: wrong or missing run token")
        device = str(doc.get("device", ""))
        if doc.get("kind") not in ("heartbeat", "leave") or device not in self.addresses:
            return self._drop(f"from {address}: unknown device {bounded(device, 40)!r}")
        if address not in self.addresses[device]:
            return self._drop(f"from {address}: not an address of device {device!r}")
        try:
            message = HeartbeatMessage.model_validate(doc)
        except ValidationError:  # fields of the wrong type: a worker of another build
            return self._drop(f"from {address}: malformed beat of device {device!r}")
        seq = message.seq
        with self._lock:
            if seq <= self._last_seq.get(device, 0):  # a worker numbers its beats from 1, once per run
                return self._drop(f"from {address}: replayed beat {seq} of device {device!r}")
            self._last_seq[device] = seq
        return Beat(device, address, time.monotonic(), message)

    def _drop(self, reason: str) -> None:
        self.dropped.add(reason)
        return None


def probe(host: str, port: int, token: str, device: str, timeout_s: float) -> bool:
    """True when the worker answers a fresh challenge within `timeout_s` over its own TCP connection."""
    nonce = secrets.token_hex(16)
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            conn.sendall(f"{nonce}\n".encode())
            reply = b""
            while not reply.endswith(b"\n"):
                conn.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = conn.recv(MAX_REPLY_BYTES)
                if not chunk:
                    return False
                reply += chunk
                if len(reply) > MAX_REPLY_BYTES:  # not an answer: whatever listens there is not the worker
                    return False
    except OSError:
        return False
    return hmac.compare_digest(reply.strip(), probe_answer(token, nonce, device).encode())


# --- the worker's side -----------------------------------------------------------------------------

class ProbeResponder(_SocketThread):
    """Answers the coordinator's probes on `host` (the worker's address facing the coordinator).

    One thread serves every connection through a selector: each gets PROBE_READ_S to send a nonce
    of at most MAX_NONCE_BYTES, and at most MAX_PROBE_CONNECTIONS are open (a new one closes the
    oldest), so connections held open by anyone cannot keep the coordinator's probe waiting."""

    thread_name = "probe-responder"

    def __init__(self, host: str, token: str, device: str) -> None:
        self.token, self.device = token, device
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(MAX_PROBE_CONNECTIONS)
        self._sock.setblocking(False)
        self.port = self._sock.getsockname()[1]
        self._open: dict[socket.socket, tuple[float, bytearray]] = {}
        """Connections being served: when each must have sent its nonce, and what it sent so far."""

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._sock, selectors.EVENT_READ)
        try:
            while self._running:
                for key, _ in selector.select(timeout=0.2):  # 0.2: stop() stays prompt
                    try:
                        if key.fileobj is self._sock:
                            self._accept(selector)
                        else:
                            self._read(selector, key.fileobj)
                    except Exception:  # one connection's trouble is that connection's
                        if key.fileobj is not self._sock:
                            self._close(selector, key.fileobj)
                self._expire(selector)
        finally:
            for conn in list(self._open):
                self._close(selector, conn)
            selector.close()

    def _accept(self, selector) -> None:
        try:
            conn, _ = self._sock.accept()
        except OSError:
            return
        if len(self._open) >= MAX_PROBE_CONNECTIONS:  # the oldest is the likeliest to be idle
            self._close(selector, min(self._open, key=lambda c: self._open[c][0]))
        conn.setblocking(False)
        self._open[conn] = (time.monotonic() + PROBE_READ_S, bytearray())
        selector.register(conn, selectors.EVENT_READ)

    def _read(self, selector, conn: socket.socket) -> None:
        _, received = self._open[conn]
        chunk = conn.recv(MAX_NONCE_BYTES + 1 - len(received))
        received += chunk
        line, newline, _ = bytes(received).partition(b"\n")
        if newline and NONCE.fullmatch(line.strip()):
            conn.send(f"{probe_answer(self.token, line.strip().decode(), self.device)}\n".encode())
        if newline or not chunk or len(received) > MAX_NONCE_BYTES:
            self._close(selector, conn)

    def _expire(self, selector) -> None:
        now = time.monotonic()
        for conn in [c for c, (deadline, _) in self._open.items() if deadline < now]:
            self._close(selector, conn)

    def _close(self, selector, conn: socket.socket) -> None:
        self._open.pop(conn, None)
        try:
            selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()


class HeartbeatSender(_SocketThread):
    """Sends a beat every `period_s` and reads the acknowledgements in between (one thread).

    `interrupt` is set when the coordinator's generation moves past ours (a reconfiguration: stop
    the round) or when the coordinator stopped answering (`orphaned`: stop cleanly). Orphaned means
    no acknowledgement for `orphan_after_s` *and* for every beat sent meanwhile (at least three):
    a worker whose threads were starved of the GIL sent no beats, so it is not orphaned by the
    silence that follows. The training loop sets `round` and `samples_per_s` for the status table.
    """

    def __init__(self, device: str, token: str, coordinator: tuple[str, int], *, source: str, period_s: float,
                 orphan_after_s: float, probe_port: int) -> None:
        self.device, self.token, self.coordinator = device, token, coordinator
        self.period_s, self.orphan_after_s, self.probe_port = period_s, orphan_after_s, probe_port
        family = socket.AF_INET6 if ":" in source else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_DGRAM)
        self._sock.bind((source, 0))
        self.port = self._sock.getsockname()[1]
        """Where acknowledgements come to."""
        self.generation = 0
        """The generation this worker runs in (set by the training loop after a reconfiguration)."""
        self.coordinator_generation = 0
        self.round = 0
        self.samples_per_s = 0.0
        self.leaving = False
        self.interrupt = threading.Event()
        self.orphaned = threading.Event()
        self._last_ack = time.monotonic()
        self._unanswered = 0
        self._seq = 0

    def beat_now(self) -> None:
        self._seq += 1
        self._unanswered += 1
        message = HeartbeatMessage(kind="leave" if self.leaving else "heartbeat", device=self.device, seq=self._seq,
                                   generation=self.generation, round=self.round,
                                   samples_per_s=round(self.samples_per_s, 3), probe_port=self.probe_port)
        try:
            self._sock.sendto(sign(self.token, message.model_dump()), self.coordinator)
        except OSError:
            pass  # no route (a cut link): the missing acknowledgements tell

    def _serve(self) -> None:
        unanswered_limit = max(3, int(self.orphan_after_s / self.period_s))
        while self._running:
            self.beat_now()
            deadline = time.monotonic() + self.period_s
            while self._running and time.monotonic() < deadline:
                self._receive(min(0.2, max(0.01, deadline - time.monotonic())))  # 0.2: stop() stays prompt
            silent = time.monotonic() - self._last_ack > self.orphan_after_s
            if silent and self._unanswered >= unanswered_limit:
                self.orphaned.set()
                self.interrupt.set()

    def _receive(self, timeout_s: float) -> None:
        self._sock.settimeout(timeout_s)
        try:
            data, _ = self._sock.recvfrom(MAX_DATAGRAM)
        except (socket.timeout, OSError):
            return
        try:
            self._acknowledged(data)
        except Exception:  # whatever arrived, this thread goes on: it is how the worker hears the coordinator
            pass

    def _acknowledged(self, data: bytes) -> None:
        """An acknowledgement; anything else (unsigned, another kind, a malformed one) raises, and
        `_receive` drops it."""
        ack = Ack.model_validate(verify(self.token, data))
        self._last_ack = time.monotonic()
        self._unanswered = 0
        self.coordinator_generation = max(self.coordinator_generation, ack.generation)
        if self.coordinator_generation > self.generation:
            self.interrupt.set()

    def wait_generation(self, timeout_s: float) -> int | None:
        """The coordinator's generation once it is past ours (None on timeout or orphaned)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.orphaned.is_set():
            if self.coordinator_generation > self.generation:
                return self.coordinator_generation
            time.sleep(0.02)
        return None
