"""Zoo tests never write to the real user cache, and run torch single-threaded.

The models here are tiny: one intra-op thread is as fast, and it does not collapse when other jobs
(benchmarks, parallel test runs) keep the other cores busy, as OpenMP spinning does.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HPPCTL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread):
    """Every test here on one intra-op thread (tests/conftest.py)."""


def shipped_table_version() -> str:
    import json

    from hppctl.zoo.cache import SHIPPED_TABLE

    return json.loads(SHIPPED_TABLE.read_text())["generated_with"]["transformers"]


def installed_transformers() -> str:
    from importlib.metadata import version

    return version("transformers")


needs_table_transformers = pytest.mark.skipif(
    installed_transformers() != shipped_table_version(),
    reason=f"the shipped layer table is for transformers {shipped_table_version()}, {installed_transformers()} is "
           f"installed (`pip install -e .` installs the table's version; `python -m hppctl.zoo.tables` regenerates)")
