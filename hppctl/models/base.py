"""The one base class of every structure that crosses a boundary (files, processes, steps)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class FrozenModel(BaseModel):
    """Strict, immutable, and loud about misspelt keys."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid", populate_by_name=False)
