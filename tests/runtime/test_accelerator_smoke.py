"""bench/gpu_smoke.py on a machine without CUDA: it checks the CPU half (profile, plan, a 2-stage
run on two local workers that must learn), says the GPU half was skipped, and exits 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(600)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA mode needs a machine without CUDA")
def test_gpu_smoke_without_cuda_checks_the_cpu_half_and_skips(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_smoke.py"), "--out", str(tmp_path),
                           "--batch-sizes", "8,16"], capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("CPU fp32: ") and "samples/s" in lines[0]
    assert lines[1].startswith("CPU bf16: ") and lines[2].startswith("CPU fp16: ")
    assert lines[3].startswith("CPU fp32, split backward: ") and "largest relative difference" in lines[3]
    assert "split_backward: true" in (tmp_path / "plan-cpu-split.yaml").read_text()
    assert lines[-1].startswith("skipped: no CUDA (") and lines[-1].endswith("CPU half passed")
    assert (tmp_path / "plan-cpu.yaml").exists() and (tmp_path / "model-cpu-fp32.pt").exists()
