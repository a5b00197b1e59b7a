"""Typed errors raised by library code. Only `hppctl.cli` turns them into messages and exit codes."""

from __future__ import annotations

import re

from hppctl.limits import MAX_ERROR_LINE_CHARS, MAX_VALUE_CHARS


def shorten(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    """`text` cut to `limit` characters with an ellipsis: an error line never repeats a huge value
    from a file or a flag (a 1 MB preset name was a 1 MB error line)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def first_line(error: BaseException) -> str:
    """The first line of an exception's message, at most 80 characters (torch's run to a page)."""
    lines = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip().splitlines()  # no terminal escapes
    text = lines[0] if lines else error.__class__.__name__
    return text if len(text) <= 80 else text[:77] + "..."


def one_line(message: str, limit: int = MAX_ERROR_LINE_CHARS) -> str:
    """`message` as one line of at most `limit` characters: newlines (a file name may hold one) shown
    as `\\n`, and a message still too long cut in the middle, keeping what failed and why."""
    text = message.replace("\r", "\\r").replace("\n", "\\n")
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return text[:head] + "…" + text[len(text) - (limit - 1 - head):]


EXIT_CODES: tuple[tuple[int, str, str], ...] = (
    (0, "ok", "the command did what it was asked"),
    (1, "runtime_failure", "a run, a worker, a remote command or the machine failed"),
    (2, "bad_input", "a file, field, flag or missing optional dependency the user can fix; nothing was started"),
    (3, "infeasible", "no plan fits the memory budgets"),
    (4, "diverged", "training diverged: a non-finite loss, or a loss far above its start; "
                    "the newest complete checkpoint round is one whose loss was finite"),
    (75, "lock_held", "another run holds the checkpoint directory (EX_TEMPFAIL): retry later, a cron job skips"),
    (130, "interrupted", "Ctrl-C"),
    (141, "broken_pipe", "the reader of stdout went away (`hppctl models | head -1`); nothing printed"),
)
"""The exit-code contract, the one table: (code, kind, meaning). `hppctl.cli` maps errors to it,
docs/architecture.md ("Exit codes") prints it, and a test keeps the two equal."""


class HppctlError(Exception):
    """Base of every error hppctl raises on purpose. `exit_code` is what the CLI returns, `kind` the
    name a `--json` error document gives it (`EXIT_CODES`)."""

    exit_code = 1
    kind = "runtime_failure"


class BadInput(HppctlError):
    """A file, field or argument the user gave is invalid (exit 2)."""

    exit_code = 2
    kind = "bad_input"


class UnknownModel(BadInput):
    pass


class UnknownPreset(BadInput):
    pass


class PlanMismatch(BadInput):
    """A plan used with a profile or model it was not made for."""


class Infeasible(HppctlError):
    """No plan fits the memory budgets (exit 3)."""

    exit_code = 3
    kind = "infeasible"


class RuntimeFailure(HppctlError):
    """A run, a remote command or a worker failed (exit 1)."""

    exit_code = 1


class LockHeld(HppctlError):
    """Another run holds a lock this command needs (exit 75, EX_TEMPFAIL of sysexits.h): nothing is
    wrong, try later. A scheduler retries, a cron job skips quietly; the message is one line."""

    exit_code = 75
    kind = "lock_held"


class Diverged(HppctlError):
    """Training diverged (exit 4): a non-finite loss, or a loss far above its start. Distinct from a
    crash (1) so that CI and cron can tell a broken training from a broken machine."""

    exit_code = 4
    kind = "diverged"
