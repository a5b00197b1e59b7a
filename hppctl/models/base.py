"""The one base class of every structure that crosses a boundary (files, processes, steps)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict


class FrozenModel(BaseModel):
    """Strict, immutable, and loud about misspelt keys."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid", populate_by_name=False)


def duplicates(names: Iterable[str]) -> list[str]:
    """Names given more than once, sorted. Linear: `names.count(n)` per name was quadratic, and
    20,000 devices took 10 s to validate."""
    return sorted(name for name, times in Counter(names).items() if times > 1)


def listed(names: list[str], most: int = 5) -> str:
    """The first few names and how many more: 20,000 duplicates still make one short error line."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more
