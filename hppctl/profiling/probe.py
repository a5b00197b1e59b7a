"""The on-device probe: `python -m hppctl.profiling.probe KIND --args JSON [--path DIR] [--import MODULE]`.

`--path DIR` (the user's `--workdir` as the device holds it; `~` is expanded) goes first on the
import path before anything is imported (hppctl/usercode.py, the root worker processes use too),
so `--import` modules and a user model resolve from it, ahead of the current directory.

Prints one JSON record per line on stdout (parse.py reads them), ending with
`{"type": "done", "seconds": …}`; on a failure it prints `{"type": "error", "error": …}` and
exits 1. Importing this module costs no torch: kinds are resolved lazily.

Kinds are a registry, so other measurements plug in without touching this file:

    from hppctl.profiling.probe import register_kind

    @register_kind("inference-blocks")           # or register_kind("x", "package.module:function")
    def blocks(args: dict) -> Iterator[dict]: ...

and the orchestrator runs `python -m hppctl.profiling.probe inference-blocks --import package.module`
(`run_probe(..., imports=[...])` in remote.py), which imports the module that registers the kind.

Built-in kinds: `identify` (device.py), `train` (train_probe.py), `link-serve`/`link-test`
(netprobe.py), `sleep` (tests).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from hppctl import usercode
from hppctl.allocator import steady_heap

PROBE_VERSION = 6
"""Bumped whenever a kind changes what or how it measures; part of every cache key. (Accelerators
did not bump it: a CPU measures as before, and a GPU device has another device fingerprint.)
5: `train` passes carry each layer's weight-gradient time (train_probe.layer_pass): a cache of
version 4, whose passes lack it, is measured again rather than giving a profile without it.
6: the whole backward no longer runs beside the input-only run's gradients (they had slowed it by
15-25 %, so version 5's backward times are high: measured again)."""

Kind = Callable[[dict[str, Any]], Iterator[dict[str, Any]]]
KINDS: dict[str, Kind | str] = {
    "train": "hppctl.profiling.train_probe:measure",
    "link-serve": "hppctl.profiling.netprobe:link_serve",
    "link-test": "hppctl.profiling.netprobe:link_test",
}


def register_kind(name: str, target: Kind | str | None = None):
    """Register a probe kind: `register_kind("k", fn)`, `register_kind("k", "mod:fn")`, or as a decorator."""
    if target is not None:
        KINDS[name] = target
        return target

    def decorate(fn: Kind) -> Kind:
        KINDS[name] = fn
        return fn

    return decorate


def resolve_kind(name: str) -> Kind:
    target = KINDS.get(name)
    if target is None:
        raise KeyError(f"unknown probe kind {name!r} (known: {', '.join(sorted(KINDS))})")
    if isinstance(target, str):
        module, _, attribute = target.partition(":")
        target = getattr(importlib.import_module(module), attribute)
        KINDS[name] = target
    return target


@register_kind("identify")
def _identify(args: dict[str, Any]) -> Iterator[dict[str, Any]]:
    from hppctl.profiling import device

    identity = device.identify(measure_quota=bool(args.get("measure_quota", True)), threads=args.get("threads"),
                               accelerator=str(args.get("accelerator", "cpu")))
    yield {**identity, "probe_version": PROBE_VERSION}


@register_kind("sleep")
def _sleep(args: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Prints a record, then sleeps: for tests of timeouts and interruption."""
    yield {"type": "progress", "phase": "sleeping", "done": 0, "total": 1}
    time.sleep(float(args.get("seconds", 1.0)))
    yield {"type": "slept", "seconds": float(args.get("seconds", 1.0))}


def use_path(path: str) -> None:
    """`path` first on the import path; a missing one is the device's error (a workdir not installed)."""
    if not os.path.isdir(os.path.expanduser(path)):
        raise FileNotFoundError(f"--workdir {path} is missing on this device")
    usercode.set_root(path)


class ImportFailed(Exception):
    """An `--import` module raised at import: the device's error names the module and what it raised."""


def import_first(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - the user's module may raise anything at import
        raise ImportFailed(f"cannot import {module!r} on this device ({e.__class__.__name__}: {e})") from None


def emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hppctl.profiling.probe")
    parser.add_argument("kind")
    parser.add_argument("--args", default="{}", help="JSON object of the kind's arguments")
    parser.add_argument("--import", dest="imports", action="append", default=[],
                        help="module to import first (it registers more kinds)")
    parser.add_argument("--path", default=None, help="a directory (the user's --workdir) first on the import path")
    a = parser.parse_args(argv)
    started = time.perf_counter()
    steady_heap()  # the allocator the workers run with (hppctl/allocator.py)
    try:
        if a.path is not None:
            use_path(a.path)
        for module in a.imports:
            import_first(module)
        kind = resolve_kind(a.kind)
        for record in kind(json.loads(a.args)):
            emit(record)
    except BrokenPipeError:  # the orchestrator went away: stop quietly
        return 1
    except MemoryError:
        emit({"type": "error", "error": "out of memory (MemoryError)", "exception": "MemoryError"})
        return 1
    except Exception as e:  # noqa: BLE001 - the one place that turns any failure into a record
        emit({"type": "error", "error": f"{e.__class__.__name__}: {e}", "exception": e.__class__.__name__})
        return 1
    emit({"type": "done", "seconds": time.perf_counter() - started})
    return 0


if __name__ == "__main__":
    # Run the canonical module's main, so kinds registered by `--import`ed modules (which import
    # `hppctl.profiling.probe`, not `__main__`) land in the registry main reads.
    from hppctl.profiling.probe import main as canonical_main
    from hppctl.shutdown import exit_process

    exit_process(canonical_main())  # without the collector's shutdown passes: hppctl/shutdown.py
