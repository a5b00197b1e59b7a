"""`hppctl demo` end to end on the tiny CNN (the default model takes about a minute; see docs/benchmarks.md)."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]


def test_demo_profiles_plans_trains_and_reports(cli, tmp_path):
    code, out, err = cli("demo", "--model", "tiny-cnn", "--epochs", "1", "--profiler", "quick",
                         "--workdir", tmp_path, "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["strategy"] == "asteroid" and summary["dataset"] == "digits"
    assert summary["rounds_run"] == 22 and summary["samples_per_s"] > 0
    assert 0.0 <= summary["test_accuracy"] <= 1.0
    for name in ("cluster.yaml", "profile.json", "plan.yaml", "metrics.jsonl", "model.pt"):
        assert (tmp_path / name).exists()
    assert "[3/4] plan (asteroid)" in err
