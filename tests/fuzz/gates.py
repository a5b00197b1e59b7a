"""Stops that end a command where real work would begin, so that fuzzing checks input handling only.

A fuzzed command whose input is still valid would otherwise start worker processes, measure
devices, or build a lab (never wanted here: labs need root and change the machine's network).
Each gate replaces the function at that point by one that ends the command with exit 0, as if the
work had succeeded; everything the command checks before it still runs for real. `lab up` is
reduced to what validates its spec: loading it, then `plan_lab` (presets, limits, addresses
against this machine's cores), and nothing that touches the system.

The gates are installed in-process for the whole fuzz session (tests/fuzz/conftest.py) and in
each subprocess the suite starts (`python -m tests.fuzz.dry_cli ARGS`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
from contextlib import contextmanager

import typer


def _stop(*args, **kwargs):
    raise typer.Exit(0)


def _stop_if_measuring(ctx, specs, *args, **kwargs):
    """`profile`: presets are modelled (cheap, checked for real); a measured device would be probed."""
    if specs:
        raise typer.Exit(0)
    return {}


def _lab_preflight(*args, **kwargs):
    return None


def _lab_validate_only(spec, source, *args, **kwargs):
    from hppctl.lab.layout import plan_lab

    plan_lab(spec, os.cpu_count() or 1, source)
    raise typer.Exit(0)


def _lab_build_reached(*args, **kwargs):
    raise AssertionError("fuzz gate: `lab up` reached the step that builds a lab")


# (module, attribute, replacement): the first step of real work in each command.
GATES = (
    # every run kind (training, fault tolerance, psl, inference; run, coordinator, demo, psl run)
    # starts its workers through the one launcher skeleton: stop there, before any worker
    ("hppctl.runtime.launcher", "prepare_local_workers", _stop),
    ("hppctl.cli.demo", "_profile", _stop),  # demo: its quick profile measures this machine for ~10 s
    ("hppctl.profiling.cluster", "_measure_devices", _stop_if_measuring),  # profile: local:/host: devices
    ("hppctl.lab.manager", "preflight", _lab_preflight),  # lab up: root and cgroup checks, not needed to validate
    ("hppctl.lab.manager", "up", _lab_validate_only),
    ("hppctl.lab.manager", "_build", _lab_build_reached),  # belt and braces: never build
)


def _gate(module, attribute: str, replacement) -> tuple[object, str, object]:
    if not hasattr(module, attribute):
        raise AssertionError(f"fuzz gate: {module.__name__}.{attribute} is gone; update tests/fuzz/gates.py "
                             f"before fuzzing (the command would do real work)")
    original = getattr(module, attribute)
    setattr(module, attribute, replacement)
    return module, attribute, original


def install() -> list[tuple[object, str, object]]:
    """Install every gate now (importing the gated modules, torch among them); return what to restore."""
    return [_gate(importlib.import_module(name), attribute, replacement) for name, attribute, replacement in GATES]


class _GateOnImport(importlib.abc.MetaPathFinder):
    """Installs a module's gates as it is imported: a subprocess that never imports the runtime
    (`hppctl plan`) does not pay for torch."""

    def find_spec(self, fullname, path, target=None):
        if not any(name == fullname for name, _, _ in GATES):
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        exec_module = spec.loader.exec_module

        def exec_and_gate(module):
            exec_module(module)
            for name, attribute, replacement in GATES:
                if name == fullname:
                    _gate(module, attribute, replacement)

        spec.loader.exec_module = exec_and_gate
        return spec


def install_on_import() -> None:
    """Gate every gated module when it is first imported (for a process that has imported none yet)."""
    already = [name for name, _, _ in GATES if name in sys.modules]
    if already:
        raise AssertionError(f"fuzz gate: {already} imported before the gates; use install()")
    sys.meta_path.insert(0, _GateOnImport())


def restore(saved: list[tuple[object, str, object]]) -> None:
    for module, attribute, original in reversed(saved):
        setattr(module, attribute, original)


@contextmanager
def installed():
    saved = install()
    try:
        yield
    finally:
        restore(saved)
