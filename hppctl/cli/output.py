"""Shared output helpers: `--json` documents on stdout, tables for people, progress on stderr."""

from __future__ import annotations

import json
import sys

from rich.console import Console

stderr = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)
# Piped output (files, CI logs) gets wide tables instead of rich's 80-column default.
stdout = Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def emit_json(data: object) -> None:
    """Exactly one JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    sys.stdout.flush()


def note(message: str) -> None:
    """Progress for people, on stderr so that `--json` stdout stays clean."""
    stderr.print(message)
