"""`hppctl plan --trial` refuses what it cannot do before it plans or starts a worker: one line, exit 2,
no plan file written."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "examples" / "local-tiny-cnn.json"
CLUSTER = ROOT / "examples" / "local.yaml"


@pytest.mark.parametrize("extra, message", [
    (["--micro-batch", "16"], "--trial: chooses the micro-batch by measuring candidates; give --micro-batch auto"),
    (["--micro-batch", "auto", "--compare"], "--trial: trains one strategy's candidates; not with --compare"),
    (["--micro-batch", "auto", "--trial-rounds", "2"], "--trial-rounds: 2 leaves no round after the 2 warm-up"),
    (["--micro-batch", "auto", "--trial-top", "0"], "--trial-top"),
    (["--micro-batch", "auto", "--trial-passes", "0"], "--trial-passes"),
    (["--micro-batch", "auto", "--timeout", "0"], "--timeout"),
])
def test_refused_flags(cli, tmp_path, extra, message):
    out = tmp_path / "plan.yaml"
    code, _, err = cli("plan", "--profile", PROFILE, "--global-batch", 64, "--trial", CLUSTER, *extra, "--out", out)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_a_cluster_without_the_profiles_devices_is_named(cli, tmp_path):
    cluster = tmp_path / "two.yaml"
    cluster.write_text("name: two\ndevices:\n  - {name: w0, local: true}\n  - {name: w1, local: true}\n")
    out = tmp_path / "plan.yaml"
    code, _, err = cli("plan", "--profile", PROFILE, "--global-batch", 64, "--micro-batch", "auto",
                       "--trial", cluster, "--out", out)
    assert code == 2 and err.strip() == f"error: --trial: {cluster}: devices: no device 'w2' (the profile plans on it)"
    assert not out.exists()


def test_a_missing_cluster_file_is_named(cli, tmp_path):
    code, _, err = cli("plan", "--profile", PROFILE, "--global-batch", 64, "--micro-batch", "auto",
                       "--trial", tmp_path / "nope.yaml")
    assert code == 2 and "nope.yaml" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("flag, value", [("--trial-top", "2"), ("--trial-rounds", "5"), ("--trial-passes", "2"),
                                         ("--timeout", "60")])
def test_a_trial_flag_without_trial_is_refused(cli, tmp_path, flag, value):
    code, _, err = cli("plan", "--profile", PROFILE, "--global-batch", 64, "--micro-batch", "auto", flag, value)
    assert code == 2 and err.strip() == f"error: {flag}: goes with --trial CLUSTER (it sets how candidates are trained on it)"


def test_a_cluster_whose_device_is_a_preset_is_refused_before_any_worker(cli, tmp_path):
    cluster = tmp_path / "preset.yaml"
    cluster.write_text("name: p\ndevices:\n  - {name: w0, local: true}\n  - {name: w1, local: true}\n"
                       "  - {name: w2, preset: jetson-nx}\n")
    out = tmp_path / "plan.yaml"
    code, _, err = cli("plan", "--profile", PROFILE, "--global-batch", 64, "--micro-batch", "auto",
                       "--trial", cluster, "--out", out)
    assert code == 2 and "device 'w2' is a preset (jetson-nx)" in err and "hppctl plan --trial" in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
