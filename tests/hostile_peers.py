"""Socket helpers for tests that play a hostile peer on loopback (127.0.0.2 plays another machine)."""

from __future__ import annotations

import socket
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect_from(source: str, port: int) -> socket.socket:
    """A connection to 127.0.0.1:`port` from the address `source`, retried until the server listens."""
    for _ in range(100):
        s = socket.socket()
        s.bind((source, 0))
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
            return s
        except ConnectionRefusedError:
            s.close()
            time.sleep(0.05)
    raise AssertionError("the server never listened")


def ping_until_closed(conn: socket.socket, most: int = 10_000) -> int:
    """A pinger that never stops on its own: one byte out, one answer back, until the server closes
    (or `most` answers). Returns how many pings were answered."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    answered = 0
    try:
        while answered < most:
            conn.sendall(b"p")
            if not conn.recv(64):
                break
            answered += 1
    except OSError:
        pass
    return answered
