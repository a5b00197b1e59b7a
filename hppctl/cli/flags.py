"""Checks of flags that several commands share, so that each refuses bad values with the same line.

Numbers: `nan` and `inf` are refused like -1. A non-finite value passed `value <= 0` and reached
pydantic (a traceback, exit 1), torch (`--lr inf` trained a model into NaN without a word) or `int()`
(`--timeout inf`: OverflowError)."""

from __future__ import annotations

import math

from hppctl.errors import BadInput


def positive(flag: str, value, allow_zero: bool = False):
    """`value` itself (None passes: an unset optional flag), or BadInput naming the flag."""
    if value is None:
        return value
    finite = not isinstance(value, float) or math.isfinite(value)
    if not finite or value < 0 or (value == 0 and not allow_zero):
        raise BadInput(f"{flag}: must be a {'non-negative' if allow_zero else 'positive'} finite number (got {value})")
    return value


def check_optimizer_flags(optimizer: str, lr: float, momentum: float, weight_decay: float) -> None:
    """The optimizer's flags (`hppctl run` and `hppctl coordinator`): left to TrainOptions, a negative
    --momentum or --weight-decay printed pydantic's traceback and exit 1."""
    if optimizer not in ("sgd", "adam"):
        raise BadInput(f"--optimizer: unknown value {optimizer!r} (sgd or adam)")
    positive("--lr", lr)
    positive("--momentum", momentum, allow_zero=True)
    positive("--weight-decay", weight_decay, allow_zero=True)
