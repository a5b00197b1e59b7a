"""Every long phase of a real run reports progress on stderr, as timestamped lines when stderr is a
pipe (issue 25, item 4: 108 s of silence after the bar for BatchNorm re-estimation and the test
pass; nothing for ~40 s of a Galaxy run; an nf1b bar that moved once per epoch; no timestamps in a
log). Real `hppctl run` processes: their stderr is a pipe, as in cron or CI. Galaxy's phases:
tests/galaxy/test_cli.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from hppctl.store import save
from tests.runtime.factories import local_cluster, make_plan

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) (.*)$")


def hppctl(*argv) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "hppctl", *map(str, argv)], capture_output=True, text=True,
                          env=env, timeout=240, cwd=ROOT)


def log_lines(stderr: str) -> list[tuple[datetime, str]]:
    """The timestamped lines, parsed; their times never go back."""
    found = [(datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%SZ"), m[2]) for m in map(LINE.match, stderr.splitlines()) if m]
    assert [t for t, _ in found] == sorted(t for t, _ in found)
    return found


def texts(stderr: str) -> list[str]:
    return [text for _, text in log_lines(stderr)]


def phase_lines(stderr: str, phase: str) -> tuple[str, str]:
    """The phase's start and end lines, in order, the end a success."""
    lines = texts(stderr)
    start = next(i for i, t in enumerate(lines) if t.startswith(f"{phase}: started"))
    end = next(i for i, t in enumerate(lines) if t.startswith(f"{phase}: done in "))
    assert start < end, lines
    return lines[start], lines[end]


def test_training_recalibration_and_test_pass_are_logged_with_timestamps(tmp_path):
    save(tmp_path / "plan.yaml", make_plan("tiny-cnn", [((0, 6), ["a"], [16]), ((6, 11), ["b"], [16])],
                                           global_batch=32, micro_batch=16))
    save(tmp_path / "c.yaml", local_cluster("a", "b"))
    done = hppctl("run", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "c.yaml", "--dataset", "digits",
                  "--rounds", 3, "--bn-recalibrate", 256, "--threads", 1, "--log-every", 0.2, "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)  # stdout: the one JSON document, nothing else
    assert summary["bn_recalibration"]["samples"] == 256 and summary["test_accuracy"] is not None
    assert phase_lines(done.stderr, "workers")[0] == "workers: started (2 workers)"
    assert phase_lines(done.stderr, "training")[0] == "training: started (3 rounds)"
    assert phase_lines(done.stderr, "BatchNorm recalibration")[0] == "BatchNorm recalibration: started (256 samples)"
    assert phase_lines(done.stderr, "test pass")[0] == "test pass: started (2 batches)"  # 360 test digits
    assert phase_lines(done.stderr, "test pass (running averages)")[0].endswith("(2 batches)")
    lines = texts(done.stderr)
    assert lines.index("training: started (3 rounds)") < lines.index("BatchNorm recalibration: started (256 samples)") \
        < lines.index("test pass: started (2 batches)")
    assert "all workers joined" in lines


def test_a_resumed_run_logs_the_rounds_it_runs(tmp_path):
    save(tmp_path / "plan.yaml", make_plan("tiny-cnn", [((0, 6), ["a"], [16]), ((6, 11), ["b"], [16])],
                                           global_batch=32, micro_batch=16))
    save(tmp_path / "c.yaml", local_cluster("a", "b"))
    for start in (0, 2):  # a cron line: each start trains two rounds more
        done = hppctl("run", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "c.yaml", "--dataset", "digits",
                      "--checkpoint-dir", tmp_path / "ck", "--resume", "--more-rounds", 2, "--threads", 1,
                      "--log-every", 60, "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["start_round"] == start
        # Before, the second start's line read "training: started (4 rounds)", as if all four ran again.
        assert phase_lines(done.stderr, "training")[0] == ("training: started (2 rounds)" if start == 0
                                                           else "training: started (rounds 3-4 of 4)")


def test_nf1b_reports_progress_within_the_epoch(tmp_path):
    """One epoch of digits is 22 mini-batches of 64, 88 micro-batches: the workers' step reports
    show the epoch moving, where the bar used to move once, at its end."""
    save(tmp_path / "plan.yaml", make_plan("tiny-cnn", [((0, 6), ["a"], [16]), ((6, 11), ["b"], [16])],
                                           global_batch=64, micro_batch=16))
    save(tmp_path / "c.yaml", local_cluster("a", "b"))
    done = hppctl("run", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "c.yaml", "--dataset", "digits",
                  "--schedule", "nf1b", "--epochs", 1, "--threads", 1, "--log-every", 0.01, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rounds_run"] == 1
    steps = {int(m[1]) for m in (re.match(r"epoch 1/1 micro-batch (\d+)/88", t) for t in texts(done.stderr)) if m}
    assert len(steps) >= 2, done.stderr  # more progress updates than epochs
    assert phase_lines(done.stderr, "training")[0] == "training: started (1 epochs)"
