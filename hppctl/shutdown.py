"""How a process of hppctl ends: the CLI, a worker started with `python -m`, the profiling probe.

Why: an interpreter that imported torch spent 0.7-0.9 s of its exit in the garbage collector's
shutdown passes, which walk every object torch's import and the run created (measured on this
project's 2-core VM: a one-device `hppctl run` ended 0.77-0.94 s after its last line with the
default exit, 0.16-0.18 s with the objects frozen first). A test suite or a cron job that starts
hppctl hundreds of times paid that every time, and an SSH worker on a 0.5-core lab host twice over.

Freezing moves the objects alive at that point out of the collector's reach; everything else of an
exit still happens: `atexit` handlers, reference-counted cleanup (files closed and flushed), the
exit code. What is skipped is only the collection of reference cycles that are still alive when
the process ends, whose finalizers Python never promises to run at exit anyway.
"""

from __future__ import annotations

import gc
import sys
from typing import NoReturn


def exit_process(code: int | None) -> NoReturn:
    """`sys.exit(code)` without the garbage collector's passes over what is alive now (module docstring)."""
    gc.freeze()
    sys.exit(code)
