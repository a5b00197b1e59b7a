"""The launcher's guard against its store's address leaving this machine mid-run.

The launcher talks to its own TCPStore through a client socket connected to the listen address
(a laptop's Wi-Fi address, a lab bridge). When that address goes away (a DHCP change, an
interface taken down, a lab removed), the client's requests are never answered and never fail:
torch's store client then blocks in `recv` past its own timeout, until the kernel gives up
retransmitting (~15 min) — the run hung with nothing said (measured: a 5 s store timeout did not
end a `check` in 120 s). No Python API reaches that socket's options, so this watch checks once a
second that the address can still be bound here and, when it cannot, shuts the client socket
down: the blocked call returns at once with a DistNetworkError, and the launcher reports `lost`.

The workers' side of the same silence (`hang_up_when_silent`): a worker's connection to the store
sees the launcher's address vanish, or its laptop sleep, as no answer at all; the worker trained on,
its requests queued in the kernel, for those ~15 minutes (measured on a lab: both SSH workers still
ran 90 s after their launcher had gone). Its store socket now carries TCP keepalive and a user
timeout, so the kernel ends the connection after `silence_s` without an acknowledgement, and the
worker's next (or pending) store call fails and ends it.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import threading

INTERVAL_S = 1.0
"""How often the address is checked: one bind of a throwaway socket, ~20 µs."""


def plain_address(address: str) -> str:
    """`address` without an IPv4-mapped IPv6 prefix (`::ffff:10.0.0.1` -> `10.0.0.1`), which is how
    torch's dual-stack client socket names an IPv4 peer."""
    return address.removeprefix("::ffff:") if address.startswith("::ffff:") and "." in address else address


def is_loopback(address: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    return False


def sockets_connected_to(address: str, port: int) -> list[socket.socket]:
    """This process's TCP sockets connected to (`address`, `port`), each as a socket object on a
    duplicate descriptor (closing it leaves the owner's open; shutting it down ends the connection)."""
    found, seen = [], set()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError, ValueError):
            link = os.readlink(f"/proc/self/fd/{name}")
            # a number freed since the listing may now hold one of this loop's own duplicates
            if not link.startswith("socket:") or link in seen:
                continue
            seen.add(link)
            sock = socket.socket(fileno=os.dup(int(name)))
            try:
                peer = sock.getpeername() if sock.type == socket.SOCK_STREAM else None
            except OSError:
                peer = None
            if peer and plain_address(peer[0]) == address and peer[1] == port:
                found.append(sock)
            else:
                sock.close()
    return found


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port); OSError (socket.gaierror for a name that does not resolve)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def address_gone(address: str) -> OSError | None:
    """The error binding `address` meets when it is no longer this machine's, else None (other
    errors, such as running out of descriptors, say nothing about the address)."""
    try:
        bound_socket(address, 0).close()
    except OSError as e:
        return e if e.errno == errno.EADDRNOTAVAIL else None
    return None


class AddressWatch:
    """Watches `address` for as long as the store listens on it; `lost` says why the run's store calls
    were cut, None while the address is there. `stop()` ends the watch (idempotent)."""

    def __init__(self, address: str, port: int, *, interval_s: float = INTERVAL_S) -> None:
        self.address, self.port, self.interval_s = address, port, interval_s
        self.lost: str | None = None
        self._clients = sockets_connected_to(address, port)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hppctl-address-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stopped.wait(self.interval_s):
            error = address_gone(self.address)
            if error is not None:
                self.lost = (f"the run's store address {self.address} is no longer this machine's "
                             f"({error.strerror}): an interface went down or its address changed mid-run")
                self._cut_clients()
                return

    def _cut_clients(self) -> None:
        for sock in self._clients:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        for sock in self._clients:
            sock.close()
        self._clients = []


def hang_up_when_silent(host: str, port: int, silence_s: float) -> int:
    """Have the kernel end this process's connections to the store at (`host`, `port`) once the other
    end has acknowledged nothing for `silence_s`: keepalive probes while the connection is idle, a user
    timeout on data sent. A healthy launcher's kernel answers both however busy the launcher is, so
    only a vanished (or unreachable) one trips them. Returns how many connections were set (options
    this platform lacks are skipped)."""
    addresses = {plain_address(info[4][0]) for info in _resolved(host, port)}
    sockets = [sock for address in addresses for sock in sockets_connected_to(address, port)]
    probe_every = max(1, int(silence_s / 4))
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
               (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), probe_every),
               (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), probe_every),
               (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), 4),
               (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), int(silence_s * 1000))]
    for sock in sockets:
        with sock:
            for level, option, value in options:
                if option is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(level, option, value)
    return len(sockets)


def _resolved(host: str, port: int) -> list:
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return []
