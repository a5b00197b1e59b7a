"""Shared factories: small readable profiles and a CLI runner that returns (code, stdout, stderr)."""

from __future__ import annotations

import pytest

from hppctl.cli import run
from hppctl.profiling.synthetic import synthetic_profile


def make_profile(layers: int = 6, speeds=(1.0, 2.0, 3.0), memory_gb=None, seed: int = 0, **kw):
    memory = [int(g * 10**9) for g in memory_gb] if memory_gb else None
    return synthetic_profile(layers, list(speeds), memory_bytes=memory, seed=seed, **kw)


@pytest.fixture
def cli(capsys):
    def invoke(*argv: str) -> tuple[int, str, str]:
        code = run([str(a) for a in argv])
        captured = capsys.readouterr()
        return code, captured.out, captured.err
    return invoke


@pytest.fixture
def one_torch_thread():
    """Tiny models: one intra-op thread is as fast and does not collapse on a busy machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
