"""Ctrl-C during `hppctl profile` of a local device: exit 130, the passes measured so far stay in the
cache, and the next run measures only the rest (a real subprocess; ~30 s, marked slow).

The profile runs with SIGINT at its default disposition, as under a terminal where a user presses
Ctrl-C: a pytest started in the background by a non-interactive shell (`cmd &` in a script, nohup)
inherits SIGINT ignored, and so would the profile, which then ignores the test's Ctrl-C, finishes
and exits 0 (the failure of both two-stream suite trials of 2026-11-26, reproduced so)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow


REPEATS = 400
"""Enough passes that the run is still measuring when SIGINT arrives: with 40, tiny-cnn on a quiet
machine (0.9 ms/sample) finished both batch sizes between the first cached pass and the signal, and
the run exited 0 (failed once in the full suite on 2026-11-26)."""


def ctrl_c_at_its_default() -> None:
    """In the child before exec: SIGINT handled as a terminal's Ctrl-C would be, whatever this process inherited."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_an_interrupted_run_resumes(tmp_path):
    cluster = tmp_path / "here.yaml"
    cluster.write_text("name: here\ndevices:\n  - {name: me, local: true}\n")
    env = {**os.environ, "HPPCTL_CACHE_DIR": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "hppctl", "profile", "--cluster", str(cluster), "--model", "tiny-cnn",
            "--batch-sizes", "1,2", "--repeats", str(REPEATS), "--warmup", "0", "--out", str(tmp_path / "p.json"), "--json"]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=ctrl_c_at_its_default)
    deadline = time.monotonic() + 120
    passes = []
    while time.monotonic() < deadline and not passes:
        passes = list((tmp_path / "cache").glob("measurements/*/passes-*.jsonl"))
        time.sleep(0.05)
    assert passes, "no pass was cached within 2 minutes"
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: interrupted") and "resume" in last, stderr
    assert "failed" not in stderr and not (tmp_path / "p.json").exists()
    kept = {p.name: len(p.read_text().splitlines()) for p in passes}
    assert 0 < sum(kept.values()) < 2 * REPEATS

    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["measured"] == {"me": [1, 2]}  # finished now ...
    for name, count in kept.items():  # ... starting from what the first run left
        size = int(name.split("-")[1].split(".")[0])
        path = next((tmp_path / "cache").glob(f"measurements/*/{name}"))
        assert len(path.read_text().splitlines()) == REPEATS and count <= REPEATS, size
