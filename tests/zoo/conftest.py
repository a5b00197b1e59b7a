"""Zoo tests never write to the real user cache."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HPPCTL_CACHE_DIR", str(tmp_path / "cache"))
