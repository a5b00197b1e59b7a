"""Typed errors raised by library code. Only `hppctl.cli` turns them into messages and exit codes."""

from __future__ import annotations

from hppctl.limits import MAX_ERROR_LINE_CHARS, MAX_VALUE_CHARS


def shorten(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    """`text` cut to `limit` characters with an ellipsis: an error line never repeats a huge value
    from a file or a flag (a 1 MB preset name was a 1 MB error line)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(message: str, limit: int = MAX_ERROR_LINE_CHARS) -> str:
    """`message` as one line of at most `limit` characters: newlines (a file name may hold one) shown
    as `\\n`, and a message still too long cut in the middle, keeping what failed and why."""
    text = message.replace("\r", "\\r").replace("\n", "\\n")
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return text[:head] + "…" + text[len(text) - (limit - 1 - head):]


class HppctlError(Exception):
    """Base of every error hppctl raises on purpose. `exit_code` is what the CLI returns."""

    exit_code = 1


class BadInput(HppctlError):
    """A file, field or argument the user gave is invalid (exit 2)."""

    exit_code = 2


class UnknownModel(BadInput):
    pass


class UnknownPreset(BadInput):
    pass


class PlanMismatch(BadInput):
    """A plan used with a profile or model it was not made for."""


class Infeasible(HppctlError):
    """No plan fits the memory budgets (exit 3)."""

    exit_code = 3


class RuntimeFailure(HppctlError):
    """A run, a remote command or a worker failed (exit 1)."""

    exit_code = 1
