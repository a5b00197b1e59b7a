"""Where a long plan is: the planner names its steps, the command that plans shows them.

A 2000-layer x 32-device plan takes minutes, a `--micro-batch auto` over a large model several plans
in a row. The planner cannot run a display of its own: a second thread in the process stops it from
forking its large loops (`forked.worth_forking`), and it is a library that prints nothing. So it calls
`step(text)` where it moves on (a phase, one more device count of the DP, one more pipeline depth),
and `hppctl plan` installs the function that shows those texts (`reporting(show)`): a line rewritten
on a terminal, a timestamped line every `--log-every` seconds in a log. Without one, a step costs a
context-variable read.

Steps nest: `within(label)` prefixes the steps taken inside it, so the display reads
"micro-batch 32 (3/7) · asteroid · memory-order DP · devices 5/16". A forked child's steps are
dropped (the display belongs to the process that installed it; two writers would garble a line).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Callable, Iterator

Show = Callable[[str], None]

_SHOW: contextvars.ContextVar[tuple[int, Show] | None] = contextvars.ContextVar("hppctl_plan_show", default=None)
_LABELS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("hppctl_plan_labels", default=())

SEPARATOR = " · "


@contextlib.contextmanager
def reporting(show: Show) -> Iterator[None]:
    """Within the block, this process's planner steps go to `show(text)`."""
    token = _SHOW.set((os.getpid(), show))
    try:
        yield
    finally:
        _SHOW.reset(token)


@contextlib.contextmanager
def within(label: str) -> Iterator[None]:
    """The steps inside the block read "label · step"; entering it is a step of its own."""
    token = _LABELS.set(_LABELS.get() + (label,))
    try:
        step()
        yield
    finally:
        _LABELS.reset(token)


def step(text: str = "") -> None:
    """Tell the display (if any, and if this is the process that installed it) where the plan is."""
    current = _SHOW.get()
    if current is None or current[0] != os.getpid():
        return
    labels = _LABELS.get()
    current[1](SEPARATOR.join(labels + (text,) if text else labels))
