"""Rendezvous and process groups: the run's store, worker authentication, gloo groups.

The launcher (the run's coordinator) hosts a `torch.distributed.TCPStore` on one chosen address:
it binds the listening socket itself and hands the descriptor to the store, because a TCPStore
given a port alone listens on every interface. Workers connect to it, prove they hold the run's
token, and build their gloo process group through it.

Authentication: the launcher makes a random 32-byte token per run and gives it to each worker
on its standard input (never on a command line, which `ps` shows). Every key of the run lives
under a prefix derived from the token, and a worker joins by writing
`join/<device> = HMAC(token, nonce | device)` for a nonce the launcher published; the launcher
starts the run only when every device has joined with a valid proof. A process without the token
cannot find the run's keys nor forge a join. Limits: the store protocol itself is unauthenticated
and gloo traffic is not encrypted — run on networks you trust (the lab, a home LAN), as with
torchrun. Anyone who reaches the store's port can still store keys of their own (outside the run's
prefix), as many as they like: torch's C++ server has no quota, so the launcher's memory grows
with them. What the launcher reads back it bounds (`read_value`, `read_json`, `get_blob`): a value
longer than a worker ever writes there, one that is not JSON, or a chunk count past
MAX_BLOB_CHUNKS fails the run naming the key instead of being parsed (docs/security.md).

Worker side, in pairs (style rule 15): `init_process_groups` ... `destroy_process_groups` in a
`finally`.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
import time
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Callable

from hppctl.errors import BadInput, RuntimeFailure, first_line
from hppctl.runtime import wire
from hppctl.runtime.address_watch import AddressWatch, bound_socket, hang_up_when_silent, is_loopback

CHUNK_BYTES = 4 * 2**20
"""The libuv TCPStore refuses values over 8 MiB; large values (state dicts) travel in chunks."""
MAX_VALUE_BYTES = 8 * 2**20
"""The most the launcher takes from one key: what torch's libuv store accepts in one set (its
MAX_PAYLOAD_LEN). Only a value grown by `append` can be longer, and no worker appends."""
MAX_SHORT_BYTES = 4096
"""Keys holding a line (a join proof, a pid, a chunk count)."""
MAX_MESSAGE_BYTES = 64 * 2**10
"""A worker's error message (`failed/<device>`; a worker writes at most 2000 characters)."""
MAX_BLOB_CHUNKS = 2**14
"""A blob of up to 64 GiB (16384 chunks of 4 MiB): more is not a state dict hppctl wrote."""


def key_prefix(token: str) -> str:
    return "hppctl/" + hmac.new(token.encode(), b"hppctl-run-prefix", hashlib.sha256).hexdigest()[:32] + "/"


def join_proof(token: str, nonce: str, device: str) -> str:
    return hmac.new(token.encode(), f"{nonce}|{device}".encode(), hashlib.sha256).hexdigest()


# --- the host side ---------------------------------------------------------------------------------

def parse_listen(text: str, flag: str = "--listen") -> tuple[str, int]:
    """`HOST`, `HOST:PORT`, `[V6]:PORT` or a bare IPv6 address -> (host, port); port 0: any free one."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else rest
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:  # a name, an IPv4 address, or an IPv6 one without a port
        host, port_text = text, ""
    if not host:
        raise BadInput(f"{flag}: {text!r} has no host (HOST or HOST:PORT, e.g. 10.213.0.1:29500)")
    try:
        port = int(port_text) if port_text else 0
    except ValueError:
        raise BadInput(f"{flag}: {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise BadInput(f"{flag}: {text!r}: port {port} is out of range (0-65535)")
    return host, port


def check_listen(text: str | None, flag: str = "--listen") -> None:
    """Fail before any work if this machine cannot listen on `text`'s host (a name that does not
    resolve, an address that is not this machine's). A port in use is found when the run starts."""
    if text is None:
        return
    host, _ = parse_listen(text, flag)
    try:
        bound_socket(host, 0).close()
    except OSError as e:
        raise BadInput(f"{flag}: {text!r}: this machine cannot listen on {host} ({e.strerror or e})") from None


def listen_socket(host: str, port: int = 0) -> socket.socket:
    """A listening TCP socket bound to `host` only (never 0.0.0.0 unless asked for)."""
    try:
        sock = bound_socket(host, port)
    except OSError as e:
        raise RuntimeFailure(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(512)
    return sock


def route_source(remote_host: str) -> str:
    """The local address this machine uses to reach `remote_host`, IPv4 or IPv6 (no packet is sent).

    A name that does not resolve is the cluster file's or the flag's fault (BadInput, exit 2); an
    address this machine has no route to is the network's (RuntimeFailure, exit 1)."""
    try:
        family, _, _, _, address = socket.getaddrinfo(remote_host, 9, type=socket.SOCK_DGRAM)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise BadInput(f"host {remote_host!r} does not resolve ({getattr(e, 'strerror', None) or e})") from None
    probe = socket.socket(family, socket.SOCK_DGRAM)
    try:
        probe.connect(address)  # UDP connect sends nothing; it only picks the route
        return probe.getsockname()[0]
    except OSError as e:
        raise RuntimeFailure(f"no route to {remote_host}: {e.strerror}") from None
    finally:
        probe.close()


@dataclass
class RunStore:
    """The launcher's end: a TCPStore on one address, with the run's key prefix."""

    host: str
    port: int
    token: str
    store: object
    raw: object
    watch: AddressWatch | None = None

    @classmethod
    def start(cls, host: str, port: int = 0, *, token: str | None = None, timeout_s: float = 300.0) -> "RunStore":
        import torch.distributed as dist

        sock = listen_socket(host, port)
        address, port = sock.getsockname()[:2]
        token = token or secrets.token_hex(32)
        # The store takes the descriptor over (and closes it when it is destroyed).
        raw = dist.TCPStore(host, port, None, True, timeout=datetime.timedelta(seconds=timeout_s),
                            wait_for_workers=False, master_listen_fd=sock.detach())
        # A loopback address cannot leave; any other can, and would hang this process's store calls.
        watch = None if is_loopback(address) else AddressWatch(address, port)
        return cls(host, port, token, dist.PrefixStore(key_prefix(token), raw), raw, watch)

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        self.store = self.raw = None

    @property
    def lost(self) -> str | None:
        """Why the store's address is gone (the watch cut the launcher's connection), None while it is there."""
        return self.watch.lost if self.watch is not None else None

    @property
    def answers(self) -> bool:
        """Whether store calls can still be made: not once closed, nor once its address left (another
        call would only fail, with torch's C++ trace on stderr)."""
        return self.raw is not None and self.lost is None

    def failure(self, error: Exception) -> RuntimeFailure | None:
        """What `error`, met while the run used this store, means for the user: the store's address
        left this machine (whatever the error), or a store call failed (torch's DistError: one line,
        not its C++ trace); None for any other error, which speaks for itself."""
        if self.lost:
            return RuntimeFailure(self.lost)
        from torch.distributed import DistError

        if isinstance(error, DistError):
            return RuntimeFailure(f"the run's store on {self.host}:{self.port} failed: {first_line(error)}")
        return None

    def publish_nonce(self) -> str:
        nonce = secrets.token_hex(16)
        self.store.set(wire.nonce(), nonce)
        return nonce

    def joined(self, device: str, nonce: str) -> bool | None:
        """None: not yet; True: joined with a valid proof; False: a wrong proof (logged by the caller)."""
        key = wire.join(device)
        if not self.store.check([key]):
            return None
        proof = read_value(self.store, key, MAX_SHORT_BYTES)
        return hmac.compare_digest(proof, join_proof(self.token, nonce, device).encode())


# --- the worker side -------------------------------------------------------------------------------

STORE_SILENCE_S = 30.0
"""How long a worker's store connection may go unacknowledged before the kernel ends it (and the
worker with it): a launcher whose machine slept or left the network (runtime/address_watch.py)."""


def connect_store(host: str, port: int, token: str, *, timeout_s: float = 300.0):
    import torch.distributed as dist

    raw = dist.TCPStore(host, port, None, False, timeout=datetime.timedelta(seconds=timeout_s))
    hang_up_when_silent(host, port, STORE_SILENCE_S)
    return dist.PrefixStore(key_prefix(token), raw)


def join(store, token: str, device: str, *, timeout_s: float) -> None:
    """Prove the token, then wait until the launcher starts the run."""
    store.wait([wire.nonce()], datetime.timedelta(seconds=timeout_s))
    nonce = store.get(wire.nonce()).decode()
    store.set(wire.join(device), join_proof(token, nonce, device))
    store.wait([wire.start()], datetime.timedelta(seconds=timeout_s))


def interface_for(address: str) -> str | None:
    """Name of the local network interface that carries `address` (for GLOO_SOCKET_IFNAME)."""
    if address.startswith("127.") or address == "::1":
        return "lo"
    if ":" in address:
        return _ipv6_interface_for(address)
    SIOCGIFADDR = 0x8915
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == address:
                return name
    finally:
        probe.close()
    return None


def _ipv6_interface_for(address: str) -> str | None:
    """The interface holding IPv6 `address`, from /proc/net/if_inet6 (SIOCGIFADDR is IPv4-only):
    each line is the address as 32 hex digits, index, prefix length, scope, flags, name."""
    with contextlib.suppress(OSError, ValueError):
        wanted = socket.inet_pton(socket.AF_INET6, address.split("%")[0]).hex()
        with open("/proc/net/if_inet6") as table:
            for line in table:
                words = line.split()
                if len(words) == 6 and words[0] == wanted:
                    return words[5]
    return None


@dataclass
class Groups:
    """The default group over all devices plus one AllReduce group per multi-device stage."""

    rank: int
    world_size: int
    stage_group: object | None


def init_process_groups(store, rank: int, world_size: int, stage_ranks: list[list[int]], my_stage: int,
                        *, store_host: str, timeout_s: float, connect_timeout_s: float | None = None) -> Groups:
    """gloo over the interface that reaches the store; `new_group` for every replicated stage, in
    the same order on every rank (torch requires it).

    connect_timeout_s: a bound on forming the groups (the rendezvous and gloo's connections), shorter
    than `timeout_s`, which then applies to their operations. gloo takes both from one setting, so the
    groups are made with the bound and given `timeout_s` once formed."""
    import torch.distributed as dist

    if "GLOO_SOCKET_IFNAME" not in os.environ:
        ifname = interface_for(route_source(store_host))
        if ifname:
            os.environ["GLOO_SOCKET_IFNAME"] = ifname

    forming = datetime.timedelta(seconds=connect_timeout_s or timeout_s)
    pg_store = dist.PrefixStore(wire.PG_PREFIX, store)
    dist.init_process_group("gloo", store=pg_store, rank=rank, world_size=world_size, timeout=forming)
    made, mine = [dist.group.WORLD], None
    for p, ranks in enumerate(stage_ranks):
        if len(ranks) > 1:
            group = dist.new_group(ranks, backend="gloo", timeout=forming)
            made.append(group)
            if p == my_stage:
                mine = group
    if connect_timeout_s is not None:
        for group in made:
            _operations_timeout(group, timeout_s)
    return Groups(rank, world_size, mine)


def new_world_group(timeout_s: float, connect_timeout_s: float | None = None):
    """Another gloo group over every rank, with connections of its own (made in the same order on every
    rank, as torch requires): traffic on it does not queue behind the default group's."""
    import torch.distributed as dist

    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=connect_timeout_s or timeout_s))
    if connect_timeout_s is not None:
        _operations_timeout(group, timeout_s)
    return group


def _operations_timeout(group, timeout_s: float) -> None:
    # torch's own setter (private, since 2.2; torch pinned <= 2.13): a gloo group has no public one.
    from torch.distributed.distributed_c10d import _rank_not_in_group, _set_pg_timeout

    if not _rank_not_in_group(group):  # new_group returns a placeholder on ranks outside the group
        _set_pg_timeout(datetime.timedelta(seconds=timeout_s), group)


def abandon_process_groups(retired: list) -> None:
    """Leave the groups of a generation (or those of one that did not form): drop them from torch's
    registry, keeping a reference in `retired` (a group's destructor waits for operations stuck on a
    lost peer), and restart torch's group numbering. torch names an unnamed group by a per-process
    counter that `init_process_group` advances before the rendezvous, and only destroying the default
    group resets it: a rank whose default group failed to form would name its next groups one further
    than its peers, and their rendezvous would never meet."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    if dist.is_initialized():
        retired.append(dist.group.WORLD)
        dist.destroy_process_group()
    distributed_c10d._world.group_count = 0


def destroy_process_groups() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


class DistComm:
    """`executor.Comm` over torch.distributed: point-to-point by device name, AllReduce in the stage group."""

    def __init__(self, ranks: dict[str, int], groups: Groups, p2p_group=None) -> None:
        self.ranks, self.groups = ranks, groups
        self.p2p_group = p2p_group
        """The process group of point-to-point messages (None: the default one)."""

    def isend(self, tensor, peer: str, tag: int):
        import torch.distributed as dist

        return dist.isend(tensor, self.ranks[peer], group=self.p2p_group, tag=tag)

    def irecv(self, tensor, peer: str, tag: int):
        import torch.distributed as dist

        return dist.irecv(tensor, self.ranks[peer], group=self.p2p_group, tag=tag)

    def allreduce_sum(self, tensor) -> None:
        import torch.distributed as dist

        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.groups.stage_group)

    def allreduce_sum_async(self, tensor):
        """gloo runs it on the group's own threads; its work's wait (or future) says when the sum is in."""
        import torch.distributed as dist

        return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.groups.stage_group, async_op=True)

    def allreduce_max(self, tensor) -> None:
        import torch.distributed as dist

        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.groups.stage_group)


# --- large values through the store ----------------------------------------------------------------

def put_blob(store, key: str, data: bytes) -> None:
    """Chunks first, then the count: a reader that sees `key/n` finds every chunk."""
    chunks = [data[i:i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]
    for i, chunk in enumerate(chunks):
        store.set(wire.blob_chunk(key, i), chunk)
    store.set(wire.blob_count(key), str(len(chunks)))


def has_blob(store, key: str) -> bool:
    return store.check([wire.blob_count(key)])


def read_value(store, key: str, limit: int) -> bytes:
    """The value of `key`, refused (RuntimeFailure naming the key) when longer than `limit`. The
    store has no way to ask a value's length first: this bounds what is kept and parsed, and a value
    can only exceed MAX_VALUE_BYTES if it was grown by `append`."""
    value = store.get(key)
    if len(value) > limit:
        raise RuntimeFailure(f"the run's store holds {len(value)} bytes under {key!r}, more than the {limit} a "
                             f"worker writes there: refused (is something other than this run's workers writing "
                             f"to the store? docs/security.md)")
    return value


def read_json(store, key: str, limit: int = MAX_VALUE_BYTES) -> dict:
    """A worker's JSON report under `key` (a dict), bounded by `limit`; RuntimeFailure otherwise."""
    value = read_value(store, key, limit)
    try:
        doc = json.loads(value)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        raise RuntimeFailure(f"the run's store holds something other than a worker's report under {key!r} "
                             f"({len(value)} bytes): refused")
    return doc


def read_line(store, key: str, limit: int = MAX_SHORT_BYTES) -> str:
    """A short text value (pid, chunk count, error message): bounded, undecodable bytes replaced."""
    return read_value(store, key, limit).decode(errors="replace")


def blob_chunks(store, key: str) -> int:
    text = read_line(store, wire.blob_count(key)).strip()
    if not (text.isdigit() and 0 < int(text) <= MAX_BLOB_CHUNKS):
        raise RuntimeFailure(f"the run's store says {key!r} has {text[:40]!r} chunks (1 to {MAX_BLOB_CHUNKS}): "
                             f"refused")
    return int(text)


def get_blob(store, key: str, *, delete: bool = False) -> bytes:
    n = blob_chunks(store, key)
    parts = [read_value(store, wire.blob_chunk(key, i), CHUNK_BYTES) for i in range(n)]
    if delete:
        for i in range(n):
            store.delete_key(wire.blob_chunk(key, i))
        store.delete_key(wire.blob_count(key))
    return b"".join(parts)


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeFailure(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


def take_round(store, round_index: int, devices: Sequence[str], read=None) -> dict | None:
    """Every device's report of one round, deleted from the store once read; None until all are in.

    The one loop that turns `metrics/{round}/{device}` keys into reports (the launcher of every run
    kind calls it), so each report is read bounded and none is left behind. `read(device, key)`: the
    typed report (runtime/launcher.py); default: `read_json`'s dict."""
    keys = wire.metrics_keys(round_index, devices)
    if not store.check(keys):
        return None
    reports = {}
    for device, key in zip(devices, keys):
        reports[device] = read(device, key) if read else read_json(store, key)
        store.delete_key(key)
    return reports
