"""Where a user's modules are imported from: the one import root of `--workdir` code.

A run names user code as `package.module:attr` (`--dataset`, and `--model` for a user model); the
module is imported from the run's `--workdir` first, then from the current directory (as `python
-m` would). The launcher sets the root once it has checked the directory (runtime/workdir.py), a
worker from its config before it joins (runtime/worker_entry.py); runtime/data.py and the zoo's
user models import through `import_module` here, so both see the same path. Pure standard
library, at the bottom of the layers: the zoo may call it, and it imports nothing of hppctl.
"""

from __future__ import annotations

import importlib
import os
import re
import sys

_root: str | None = None

_USER_SPEC = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
NOT_USER_PREFIXES = ("hf",)
"""`hf:DIR` names a Hugging Face checkpoint directory, not a module."""


def set_root(path: str | None) -> None:
    """Make `path` (a `--workdir`; `~` expanded) the first entry of the import path; None: no workdir."""
    global _root
    if _root is not None and _root in sys.path:
        sys.path.remove(_root)
    _root = os.path.abspath(os.path.expanduser(path)) if path else None
    _put_first()


def root() -> str | None:
    """The workdir user modules are imported from first (None: none given)."""
    return _root


def _put_first() -> None:
    """The current directory on the path as with `python -m` (where it is not yet), the workdir before everything."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    if _root is not None:
        if _root in sys.path:
            sys.path.remove(_root)
        sys.path.insert(0, _root)
    importlib.invalidate_caches()


def import_module(name: str):
    """Import the user's module `name` with the workdir first on the path (exceptions propagate).

    No bytecode is written for what this imports: Python's cache keys on the source's mtime in whole
    seconds and its size, so a module edited within the second after hppctl imported it, to the same
    size (`channels=6` -> `channels=5`, by a script), ran from the old bytecode in the next command
    while hppctl's fingerprint of the source said it had changed. A user's module is small; it is
    compiled again each time."""
    _put_first()
    writing = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        return importlib.import_module(name)
    finally:
        sys.dont_write_bytecode = writing


def module_of(spec: str) -> str | None:
    """The module a `package.module:attr` spec names, None for any other value (`digits`, `tiny-mlp`, `hf:DIR`)."""
    if not _USER_SPEC.fullmatch(spec):
        return None
    module = spec.partition(":")[0]
    return None if module in NOT_USER_PREFIXES else module
