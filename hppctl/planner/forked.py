"""Two CPUs for one planning loop: half its items in a forked child, the answer unchanged.

The planner is numpy on one thread; a large plan (1000 layers x 16 devices) spends most of its time
in loops whose items do not read each other's results: the DP's head groups of one device count,
`pp`'s pipeline depths. `forked_map` runs every other item in a child made by `os.fork` (the child
reads the parent's tables without copying them) and takes its results back pickled through a pipe.
The child leaves by `os._exit`: no exit handler, buffered output or atexit hook of the parent's runs
twice. A child that fails, or is killed, sends nothing whole, and its items are then run here.

Forking is opt-in, `with allowed():` (`hppctl plan` says so): a process that plans inside a run (a
re-plan beside a store, heartbeat threads and workers) or a library caller is left single-process,
and a process with a second thread never forks (a thread holding a lock at the fork would hold it
in the child forever).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import pickle
import threading
from typing import Callable, Iterator, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MIN_HEAD_PAIRS = 60_000
"""Above this many layer pairs (L > ~346 layers) the planner's large loops split with a child when
two CPUs are usable; below, a fork (~5-20 ms) costs more than it saves."""


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity; a cgroup quota is not read: under one, the child
    takes turns with the parent and the answer is the same)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


_ALLOWED: contextvars.ContextVar[bool] = contextvars.ContextVar("hppctl_planner_may_fork", default=False)


@contextlib.contextmanager
def allowed() -> Iterator[None]:
    """Within the block, the planner may fork for its large loops (`worth_forking`)."""
    token = _ALLOWED.set(True)
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def may_fork() -> bool:
    """Whether this process may split a loop with a child now: allowed (`allowed`), on two usable CPUs,
    with one thread, and not already one side of a split (whose other side keeps the other CPU busy)."""
    return _ALLOWED.get() and hasattr(os, "fork") and usable_cpus() >= 2 and threading.active_count() == 1


def worth_forking(pairs: int) -> bool:
    """Whether a loop over a model of `pairs` layer pairs should split with a child."""
    return pairs > MIN_HEAD_PAIRS and may_fork()


def map_split_if_allowed(side: Callable[[], Callable[[T], R]], items: Sequence[T]) -> list[R]:
    """`forked_map(side, items)` where `may_fork()`, else the same results in this process alone. For
    loops of whole plans (`hppctl plan --compare`: every strategy at every micro-batch), each item
    worth far more than a fork."""
    if may_fork():
        return forked_map(side, items)
    f = side()
    return [f(x) for x in items]


def forked_map(side: Callable[[], Callable[[T], R]], items: Sequence[T]) -> list[R]:
    """`[f(x) for x in items]`, each process with its own `f = side()` (a side may keep state across
    its items, such as tables to prune by; it sees only its own items'): the items at even
    positions here, the odd ones in a forked child. Results in item order."""
    items = list(items)
    if len(items) < 2:
        f = side()
        return [f(x) for x in items]
    mine, theirs = items[0::2], items[1::2]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.close(read)
            _ALLOWED.set(False)  # the parent keeps the other CPU busy: no split inside a split
            f = side()
            with os.fdopen(write, "wb") as sink:
                pickle.dump([f(x) for x in theirs], sink, protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            os._exit(0)
    os.close(write)
    source = os.fdopen(read, "rb")
    token = _ALLOWED.set(False)  # nor here while the child runs
    try:
        f = side()
        here = [f(x) for x in mine]
        sent = source.read()
    finally:
        _ALLOWED.reset(token)
        # closed first: a child still writing then fails (EPIPE) and exits, never blocks the wait
        source.close()
        os.waitpid(pid, 0)
    there = _loads(sent, len(theirs))
    if there is None:
        f = side()
        there = [f(x) for x in theirs]
    results: list = [None] * len(items)
    results[0::2], results[1::2] = here, there
    return results


def _loads(sent: bytes, count: int) -> list | None:
    """The child's results; None unless it sent all `count` of them whole."""
    try:
        found = pickle.loads(sent) if sent else None
    except (pickle.UnpicklingError, EOFError, ValueError, AttributeError, ImportError, IndexError, TypeError):
        return None
    return found if isinstance(found, list) and len(found) == count else None
