"""A fault-tolerant run shows progress within a round, as a plain run does (issue 25 item 4, issue 26
item 4): the FT worker reports its micro-batches and the one training loop (runtime/session.py) shows
the slowest device's. Before, `--profile` runs went silent between round lines. A real `hppctl run`
process with stderr a pipe, as in cron or CI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "examples" / "local-tiny-cnn.json"


def hppctl(*argv) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "hppctl", *map(str, argv)], capture_output=True, text=True,
                          env=env, timeout=240, cwd=ROOT)


def test_fault_tolerant_run_reports_micro_batches_within_a_round(tmp_path):
    # 64 micro-batches a round, reports every 0.01 s: an in-round report is shown even when rounds are
    # quick (a quiet machine runs one in ~0.15 s)
    plan = tmp_path / "plan.yaml"
    made = hppctl("plan", "--profile", PROFILE, "--global-batch", 1024, "--micro-batch", 16, "--out", plan)
    assert made.returncode == 0, made.stderr
    done = hppctl("run", "--plan", plan, "--cluster", ROOT / "examples" / "local.yaml", "--profile", PROFILE,
                  "--dataset", "digits", "--rounds", 3, "--threads", 1, "--log-every", 0.01, "--json")
    assert done.returncode == 0, done.stderr
    assert "armed: failure detection on" in done.stderr  # fault tolerance was on
    steps = [m for m in re.finditer(r"round (\d)/3 micro-batch (\d+)/64", done.stderr)]
    assert steps, done.stderr
