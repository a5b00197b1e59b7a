"""A steady heap for the processes that compute: the training probe and every worker.

Why: glibc's malloc hands blocks above its (dynamic) mmap threshold back to the kernel when
they are freed and trims the heap top past its trim threshold, so an activation buffer of a few
MB is sometimes a reused block and sometimes fresh pages that the kernel must fault in and zero.
Which layer pays for that changes from step to step and from process to process: on this
project's 2-core VM the first conv of MobileNetV2 at batch 64 took 1.5-2.0 or 2.8-3.5 ms in one
process (bimodal), and the sum of every layer's forward 108-114 ms. With the thresholds fixed
high, the same layer took 1.2-2.1 ms and the sum 94-102 ms (docs/profiling.md, "The allocator").
The profile must see the allocator the workers will run with, so both call `steady_heap()` first.

Fixed thresholds keep freed memory in the process (the trim threshold is the largest glibc
accepts): a worker's resident set stays at its peak, which is what the planner's memory budget
counts anyway. `HPPCTL_MALLOC=default` leaves glibc's behaviour alone; other C libraries (musl)
are left alone too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
"""glibc refuses a larger mmap threshold on 64-bit (HEAP_MAX_SIZE / 2): blocks above it still come from mmap."""
TRIM_THRESHOLD_MAX = 2**31 - 1
"""mallopt takes an int."""


def steady_heap() -> str:
    """Fix glibc's mmap and trim thresholds (module docstring); returns "steady" or why not."""
    if os.environ.get("HPPCTL_MALLOC", "steady") == "default":
        return "default (HPPCTL_MALLOC=default)"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "default (no glibc mallopt)"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_MAX) == 1
    return "steady" if ok else "default (mallopt refused)"
