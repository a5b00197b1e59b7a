"""Measuring the links between devices: both directions' goodput and the round trip, one pair at a time.

    link = measure_link(endpoint_a, endpoint_b, settings)     # a LinkProfile with source "measured"

A `link-serve` server starts on `b`, bound to the address `a` reaches it at, on a random port, and a
`link-test` client on `a` then streams to it for `settings.link_seconds` (b's goodput is a->b),
takes a stream back for as long (a's goodput is b->a) and times one-byte round trips
(netprobe.py). The server takes steps only from `a`'s address (as `b` reaches it) and only on
connections that start with a random token made for this link. One server and one client per
link: every launch costs a device its SSH session and interpreter start-up (~1 s on a 0.25-core
lab host), and a link used to take six. A port that is taken (or any failure) is retried on another
port. The caller runs pairs one after the other, so no two measurements share a wire or a CPU.
"""

from __future__ import annotations

import random
import secrets
from typing import Any

from hppctl.models.profile import LinkProfile
from hppctl.profiling import parse
from hppctl.profiling.remote import DeviceFailure


def link_text(link: LinkProfile) -> str:
    rates = " / ".join(f"{r * 8 / 1e6:.1f} Mbit/s" for r in link.directed_bytes_per_s or [link.bytes_per_s])
    rtt = f", rtt {link.rtt_s * 1e3:.2f} ms" if link.rtt_s is not None else ""
    return f"{rates}{rtt}"


def measure_link(a, b, settings, attempts: int = 3) -> LinkProfile:
    """Both directions' goodput and the round trip between endpoints `a` and `b`."""
    address = b.address_for(a)
    timeout = 2 * settings.link_seconds + 30
    # b takes a step only from a's address, opened with a token only the two ends were given (over
    # SSH, fresh per link): a stranger on the network cannot take the measurement (netprobe.py).
    common = {"seconds": settings.link_seconds, "count": settings.ping_count, "token": secrets.token_hex(16)}
    served, tested = _serve_and_call(
        b, a, "link-serve", "link-test", {**common, "bind": address, "peer": a.address_for(b)},
        {**common, "to": address}, attempts, timeout)
    a_to_b = parse.received(served)  # measured where the bytes arrived
    b_to_a = parse.received(tested)
    return parse.link_profile(a.name, b.name, a_to_b, b_to_a, parse.pinged(tested))


def _serve_and_call(server, client, server_kind: str, client_kind: str, server_args: dict, client_args: dict,
                    attempts: int, timeout: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Start `server_kind` on `server` on a random port, then run `client_kind` on `client` against it;
    (server records, client records). A taken port (or any failure) is retried on another port."""
    last: DeviceFailure | None = None
    for _ in range(attempts):
        port = random.randint(20000, 59999)
        running = server.start_probe(server_kind, {**server_args, "port": port, "timeout_s": timeout},
                                     timeout=timeout + 10)
        try:
            client_records = client.probe(client_kind, {**client_args, "port": port}, timeout=timeout + 10)
        except DeviceFailure as e:
            last = e
            try:
                running.wait()
            except DeviceFailure as server_error:
                last = server_error  # e.g. the port was taken: the server's reason says so
            continue
        return running.wait(), client_records
    raise last if last is not None else DeviceFailure("link measurement failed")


def merge_links(configured: list[LinkProfile], measured: list[LinkProfile]) -> list[LinkProfile]:
    """Measured links replace configured ones for the same pair; configured ones stay marked `inventory`."""
    pairs = {frozenset(link.between) for link in measured}
    kept = [LinkProfile(between=l.between, bytes_per_s=l.bytes_per_s, source="inventory")
            for l in configured if frozenset(l.between) not in pairs]
    return measured + kept
