"""The fault-tolerant worker's gloo transport (runtime/ft_worker.py): every wait is handed to
a `Waiters` thread, so the training thread can abandon it when the coordinator announces a re-plan
(`Interrupted`) or gloo reports a broken peer (`PeerLost`); groups left behind stay in `RETIRED_GROUPS`.
"""

from __future__ import annotations

import queue
import threading

from hppctl.errors import RuntimeFailure
from hppctl.runtime import bootstrap

RETIRED_GROUPS: list = []
"""Process groups left behind by reconfigurations (kept alive: see `FtRun._retire_group`)."""


class Interrupted(RuntimeFailure):
    """The coordinator started a reconfiguration (or went silent): the round in progress is abandoned."""


class PeerLost(RuntimeFailure):
    """A gloo operation failed: a peer died or its link broke."""


class Waiters:
    """Daemon threads that block in gloo waits on the training thread's behalf.

    gloo gives no way to abandon a wait: a send/receive work reports `is_completed()` False until
    `wait()` is called, and a wait with a timeout breaks the connection. So the training thread hands
    each wait to one of these threads and waits on an Event it can give up on; a thread stuck on an
    abandoned group stays stuck (each generation gets a fresh set)."""

    def __init__(self, threads: int = 4) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(threads):
            threading.Thread(target=self._serve, daemon=True, name=f"gloo-wait-{i}").start()

    def _serve(self) -> None:
        while True:
            work, errors, done = self.queue.get()
            try:
                work.wait()
            except BaseException as e:  # handed back to the training thread
                errors.append(e)
            done.set()

    def wait(self, work, abort: threading.Event) -> None:
        if abort.is_set():
            raise Interrupted("interrupted by the coordinator")
        errors: list[BaseException] = []
        done = threading.Event()
        self.queue.put((work, errors, done))
        while not done.wait(0.05):
            if abort.is_set():
                raise Interrupted("interrupted by the coordinator")
        if errors:
            raise PeerLost(str(errors[0])) from errors[0]


class AbortableWork:
    """A gloo work whose wait gives up when `abort` is set."""

    def __init__(self, work, abort: threading.Event, waiters: Waiters) -> None:
        self.work, self.abort, self.waiters = work, abort, waiters

    def is_completed(self) -> bool:
        return self.work.is_completed()

    def wait(self) -> None:
        self.waiters.wait(self.work, self.abort)

    def get_future(self):
        return self.work.get_future()


class AbortableComm(bootstrap.DistComm):
    def __init__(self, ranks: dict[str, int], groups: bootstrap.Groups, abort: threading.Event,
                 p2p_group=None) -> None:
        super().__init__(ranks, groups, p2p_group)
        self.abort, self.waiters = abort, Waiters()

    def isend(self, tensor, peer: str, tag: int):
        return AbortableWork(posted(lambda: super(AbortableComm, self).isend(tensor, peer, tag)), self.abort,
                             self.waiters)

    def irecv(self, tensor, peer: str, tag: int):
        return AbortableWork(posted(lambda: super(AbortableComm, self).irecv(tensor, peer, tag)), self.abort,
                             self.waiters)

    def _allreduce(self, tensor, op) -> None:
        import torch.distributed as dist

        work = posted(lambda: dist.all_reduce(tensor, op=op, group=self.groups.stage_group, async_op=True))
        self.waiters.wait(work, self.abort)

    def allreduce_sum(self, tensor) -> None:
        import torch.distributed as dist

        self._allreduce(tensor, dist.ReduceOp.SUM)

    def allreduce_max(self, tensor) -> None:
        import torch.distributed as dist

        self._allreduce(tensor, dist.ReduceOp.MAX)

    def allreduce_sum_async(self, tensor) -> AbortableWork:
        """Started from a gradient hook; its wait, at the AR action, gives up like every other."""
        import torch.distributed as dist

        work = posted(lambda: dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.groups.stage_group,
                                              async_op=True))
        return AbortableWork(work, self.abort, self.waiters)


def posted(post):
    """Post a gloo operation; gloo raises at once when the peer's connection is already closed."""
    try:
        return post()
    except RuntimeError as e:
        raise PeerLost(str(e)) from e


def prefixed(store, prefix: str):
    """`store` seen under `prefix` (a generation's own gloo rendezvous)."""
    import torch.distributed as dist

    return dist.PrefixStore(prefix, store)
