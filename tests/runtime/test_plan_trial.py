"""`hppctl plan --trial` on real local workers: the simulator's best candidates trained for a few rounds
each, the fastest measured kept, the plan file saying so. The choice rule itself (given figures) is
tests/planner/test_trial_choice.py; here the figures come from worker processes over gloo."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hppctl.models.plan import HppPlan
from hppctl.store import load

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


def test_trial_trains_the_best_simulated_candidates_and_keeps_the_fastest_measured(cli, tmp_path):
    out = tmp_path / "plan.yaml"
    code, stdout, err = cli("plan", "--profile", ROOT / "examples" / "local-tiny-cnn.json", "--global-batch", 64,
                            "--micro-batch", "auto", "--trial", ROOT / "examples" / "local.yaml",
                            "--trial-top", 2, "--trial-rounds", 3, "--out", out)
    assert code == 0, err
    choice = load(out, HppPlan).micro_batch_choice
    assert choice.ranked_by == "measured"
    usable = [c for c in choice.candidates if c.skipped is None]
    top2 = sorted(usable, key=lambda c: (-c.simulated_samples_per_s, c.micro_batch))[:2]
    measured = {c.micro_batch: c.measured_samples_per_s for c in usable if c.measured_samples_per_s is not None}
    assert set(measured) == {c.micro_batch for c in top2}  # exactly the two best simulated ran
    assert all(v > 0 for v in measured.values())
    assert choice.chosen == max(measured, key=lambda b: (measured[b], -b))
    for i, c in enumerate(top2, 1):  # each trial announced before it ran, and its figure after
        assert f"trial {i}/2: micro-batch {c.micro_batch} (" in err
        assert f"trial {i}/2: micro-batch {c.micro_batch} measured {measured[c.micro_batch]:.1f} samples/s" in err
    assert "best measured on the cluster" in stdout


def test_two_passes_run_forwards_then_backwards_and_rank_by_the_mean(cli, tmp_path):
    out = tmp_path / "plan.yaml"
    code, _, err = cli("plan", "--profile", ROOT / "examples" / "local-tiny-cnn.json", "--global-batch", 64,
                       "--micro-batch", "auto", "--trial", ROOT / "examples" / "local.yaml", "--trial-top", 2,
                       "--trial-rounds", 3, "--trial-passes", 2, "--out", out)
    assert code == 0, err
    ran = re.findall(r"trial (\d)/2 \(pass (\d)/2\): micro-batch (\d+) measured ([0-9.]+) samples/s", err)
    assert [(i, p) for i, p, _, _ in ran] == [("1", "1"), ("2", "1"), ("2", "2"), ("1", "2")]
    choice = load(out, HppPlan).micro_batch_choice
    recorded = {c.micro_batch: c.measured_samples_per_s for c in choice.candidates if c.measured_samples_per_s}
    for b in recorded:  # each candidate's figure is the mean of its two passes (printed to 0.1)
        passes = [float(v) for _, _, mb, v in ran if int(mb) == b]
        assert len(passes) == 2 and abs(recorded[b] - sum(passes) / 2) <= 0.1
    assert choice.chosen == max(recorded, key=lambda b: (recorded[b], -b))
