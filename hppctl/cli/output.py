"""Shared output helpers: `--json` documents on stdout, tables for people, progress on stderr."""

from __future__ import annotations

import json
import sys

from rich.console import Console

stderr = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)
# Piped output (files, CI logs) gets wide tables instead of rich's 80-column default.
stdout = Console(highlight=False, width=None if sys.stdout.isatty() else 200)


_documents_emitted = 0
"""JSON documents this command wrote to stdout: the error boundary adds its error document only to
an empty stdout (a partial failure, such as `profile --json` with a device lost, has printed its
summary already, and stdout must hold exactly one document)."""


def emit_json(data: object) -> None:
    """Exactly one JSON document on stdout."""
    global _documents_emitted
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    sys.stdout.flush()
    _documents_emitted += 1


def json_emitted() -> bool:
    return _documents_emitted > 0


def forget_json_emitted() -> None:
    """A new command starts (tests run several in one process)."""
    global _documents_emitted
    _documents_emitted = 0


def note(message: str) -> None:
    """Progress for people, on stderr so that `--json` stdout stays clean."""
    stderr.print(message)


def writable_path(flag: str, path, *, directory: bool = False) -> None:
    """Fail now (exit 2, naming the flag) on an output path the command could not write at the end.

    Every command calls it on each output flag right after parsing its flags, before it loads a
    file or starts a worker: a run that trains for an hour and then cannot save what it learned, or
    that emptied a symlink's target through `--metrics`, is the failure this prevents. A file must
    be missing or a regular file (`store.check_output_path`: never a symlink, FIFO or device). Its
    folder is created here, as writing would create it anyway. `directory`: the path itself is a
    folder (checkpoints)."""
    import os
    from pathlib import Path

    from hppctl.errors import BadInput
    from hppctl.store import check_output_path

    if path is None:
        return
    path = Path(path)
    folder = path if directory else path.parent
    if directory:
        if path.exists() and not path.is_dir():
            raise BadInput(f"{flag}: {path} is a file, not a directory")
    elif os.path.isdir(path):  # not Path.is_dir: it raises on a name too long
        raise BadInput(f"{flag}: {path} is a directory")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"{flag}: {path}: cannot create the folder {folder} ({e.strerror or e})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise BadInput(f"{flag}: {path}: the folder {folder} is not writable")
    if not directory:  # in a folder that exists now: what is at the path itself
        try:
            check_output_path(path)
        except BadInput as e:
            raise BadInput(f"{flag}: {e}") from None
