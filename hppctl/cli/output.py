"""Shared output helpers: `--json` documents on stdout, tables for people, progress on stderr."""

from __future__ import annotations

import json
import sys

from rich.console import Console

stderr = Console(stderr=True, highlight=False)
stdout = Console(highlight=False, soft_wrap=True)


def emit_json(data: object) -> None:
    """Exactly one JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    sys.stdout.flush()


def note(message: str) -> None:
    """Progress for people, on stderr so that `--json` stdout stays clean."""
    stderr.print(message)
