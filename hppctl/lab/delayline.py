"""A userspace delay line for kernels without `sch_netem`: NFQUEUE verdicts issued after a delay.

Why this exists: delay and loss are normally netem's job, but some kernels (this project's CI
machine among them) are built without `CONFIG_NET_SCH_NETEM`. Netfilter's NFQUEUE is almost
always there, and it can emulate a link's latency exactly: the kernel hands each packet's *id*
to this process (metadata only, no payload copy), keeps the packet, and lets it continue only
when we send the `NF_ACCEPT` verdict - which we do `delay` seconds later. Loss is a random
`NF_DROP`.

The lab applies this on the *receiving* host's input hook, after the packet has left the
sender's socket accounting; holding it on the sender's egress instead would count against TCP
small queues and throttle the sender far below the configured rate.

Run inside the host's network namespace (nft rules there send packets to our queues):

    python -m hppctl.lab.delayline --pidfile P --queue 0:0.005:0 --queue 1:0.002:0.01

Each `--queue NUM:DELAY_S:LOSS_FRACTION` binds one queue; all packets of one queue get the same
delay, so they are released in arrival order with one batch verdict.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 1, 2, 3
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 4  # hand over GSO packets whole instead of segmenting them first (fewer wake-ups)
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NF_DROP, NF_ACCEPT = 0, 1
QUEUE_MAXLEN = 20000  # packets held at once per queue: ~0.5 s at 100 Mbit/s of MTU-sized packets
RCVBUF = 16 << 20


class DelayLineError(Exception):
    pass


@dataclass(frozen=True)
class QueueRule:
    number: int
    delay_s: float
    loss: float
    """Fraction of packets dropped, 0..1."""

    @staticmethod
    def parse(text: str) -> "QueueRule":
        num, delay, loss = text.split(":")
        rule = QueueRule(int(num), float(delay), float(loss))
        if not (0 <= rule.number < 65536 and rule.delay_s >= 0 and 0 <= rule.loss <= 1):
            raise ValueError(f"bad queue rule {text!r}")
        return rule

    def format(self) -> str:
        return f"{self.number}:{self.delay_s!r}:{self.loss!r}"


def _attr(kind: int, payload: bytes) -> bytes:
    header = struct.pack("=HH", 4 + len(payload), kind)
    pad = b"\0" * ((4 - len(payload) % 4) % 4)
    return header + payload + pad


def _message(msg_type: int, flags: int, queue: int, attrs: bytes, family: int = socket.AF_UNSPEC) -> bytes:
    body = struct.pack("=BB", family, 0) + struct.pack("!H", queue) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, 0, 0) + body


def config_messages(queue: int) -> list[bytes]:
    """Bind `queue`, ask for metadata only, a long queue, and whole GSO packets."""
    bind = _attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET))
    params = _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
    maxlen = _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN))
    flags = _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO)) + _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO))
    ack = NLM_F_REQUEST | NLM_F_ACK
    return [_message(NFQNL_MSG_CONFIG, ack, queue, bind), _message(NFQNL_MSG_CONFIG, ack, queue, params),
            _message(NFQNL_MSG_CONFIG, ack, queue, maxlen), _message(NFQNL_MSG_CONFIG, ack, queue, flags)]


def verdict_message(queue: int, packet_id: int, verdict: int, batch: bool) -> bytes:
    kind = NFQNL_MSG_VERDICT_BATCH if batch else NFQNL_MSG_VERDICT
    return _message(kind, NLM_F_REQUEST, queue, _attr(NFQA_VERDICT_HDR, struct.pack("!II", verdict, packet_id)))


def parse_messages(data: bytes):
    """Yield (type, queue, attrs) for each netlink message; attrs maps attribute type -> payload."""
    offset = 0
    while offset + 16 <= len(data):
        length, msg_type, _flags, _seq, _pid = struct.unpack_from("=IHHII", data, offset)
        if length < 16:
            break
        body = data[offset + 16: offset + length]
        offset += (length + 3) & ~3
        if msg_type == NLMSG_ERROR:
            (errno,) = struct.unpack_from("=i", body, 0)
            yield NLMSG_ERROR, -errno, {}
            continue
        (queue,) = struct.unpack_from("!H", body, 2)
        attrs, pos = {}, 4
        while pos + 4 <= len(body):
            alen, atype = struct.unpack_from("=HH", body, pos)
            if alen < 4:
                break
            attrs[atype & 0x3FFF] = body[pos + 4: pos + alen]
            pos += (alen + 3) & ~3
        yield msg_type & 0xFF, queue, attrs


def open_queues(rules: list[QueueRule]) -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    try:
        sock.setsockopt(socket.SOL_SOCKET, 33, RCVBUF)  # SO_RCVBUFFORCE: root may exceed rmem_max
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
    sock.bind((0, 0))
    for rule in rules:
        for msg in config_messages(rule.number):
            sock.send(msg)
            for kind, code, _ in parse_messages(sock.recv(65536)):
                if kind == NLMSG_ERROR and code != 0:
                    raise DelayLineError(f"binding NFQUEUE {rule.number}: {os.strerror(code)}")
    return sock


def serve(sock: socket.socket, rules: list[QueueRule], stop: list[bool]) -> None:
    """Hold every queued packet for its queue's delay, then release it (or drop it, for loss)."""
    by_queue = {r.number: r for r in rules}
    pending: list[tuple[float, int, int]] = []  # (release time, queue, packet id), a min-heap
    sock.setblocking(False)
    rng = random.Random()
    while not stop[0]:
        timeout = max(0.0, pending[0][0] - time.monotonic()) if pending else 0.5
        ready, _, _ = select.select([sock], [], [], timeout)
        if ready:
            _receive(sock, by_queue, pending, rng)
        _release_due(sock, pending)


def _receive(sock, by_queue, pending, rng) -> None:
    now = time.monotonic()
    drops = []
    while True:
        try:
            data = sock.recv(1 << 16)
        except BlockingIOError:
            break
        except OSError as e:  # ENOBUFS: the kernel dropped notifications; the packets stay queued
            print(f"delayline: recv: {e}", file=sys.stderr)
            break
        for kind, queue, attrs in parse_messages(data):
            if kind != NFQNL_MSG_PACKET or NFQA_PACKET_HDR not in attrs or queue not in by_queue:
                continue
            (packet_id,) = struct.unpack_from("!I", attrs[NFQA_PACKET_HDR], 0)
            rule = by_queue[queue]
            if rule.loss and rng.random() < rule.loss:
                drops.append(verdict_message(queue, packet_id, NF_DROP, batch=False))
            else:
                heapq.heappush(pending, (now + rule.delay_s, queue, packet_id))
    if drops:
        sock.send(b"".join(drops))


def _release_due(sock, pending) -> None:
    """One batch verdict per queue: every id up to the newest due one is accepted at once."""
    now = time.monotonic()
    newest: dict[int, int] = {}
    while pending and pending[0][0] <= now:
        _, queue, packet_id = heapq.heappop(pending)
        newest[queue] = max(packet_id, newest.get(queue, 0))
    if newest:
        sock.send(b"".join(verdict_message(q, pid, NF_ACCEPT, batch=True) for q, pid in newest.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hppctl.lab.delayline")
    parser.add_argument("--queue", action="append", required=True, type=QueueRule.parse,
                        help="NUM:DELAY_SECONDS:LOSS_FRACTION (repeatable)")
    parser.add_argument("--pidfile", required=True, help="written once every queue is bound")
    args = parser.parse_args(argv)
    stop = [False]

    def _stop(*_):
        stop[0] = True

    # The delay line is part of the emulated network: a busy machine must not stretch its delays
    # or starve the ACKs it holds, so it runs ahead of ordinary processes.
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    except OSError:
        pass
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        sock = open_queues(args.queue)
    except (OSError, DelayLineError) as e:
        print(f"delayline: {e}", file=sys.stderr)
        return 1
    tmp = f"{args.pidfile}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(tmp, args.pidfile)  # readiness signal: the lab waits for this file
    serve(sock, args.queue, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
