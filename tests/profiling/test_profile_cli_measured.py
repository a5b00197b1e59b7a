"""`hppctl profile` on clusters with measured devices, through the error boundary: the devices are
fake endpoints (tests/profiling/fakes.py), everything else is the real command."""

import json

import pytest

import hppctl.profiling.cluster as cluster_module
from hppctl.models.profile import Profile
from hppctl.store import load
from tests.profiling.fakes import FakeDevice, factory

CLUSTER = """\
name: mixed
bandwidth: 100mbit
devices:
  - {name: fast, host: 10.0.0.2}
  - {name: slow, host: 10.0.0.3}
  - {name: nano0, preset: jetson-nano}
"""


@pytest.fixture
def devices(monkeypatch, tmp_path):
    found = {"fast": FakeDevice(quota=1.0), "slow": FakeDevice(quota=0.25)}
    calls = []
    original = cluster_module.profile_cluster

    def patched(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **{**kwargs, "endpoint_factory": factory(found), "cache_root": tmp_path / "cache"})

    monkeypatch.setattr(cluster_module, "profile_cluster", patched)
    found["calls"] = calls
    return found


@pytest.fixture
def cluster_file(tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(CLUSTER)
    return path


def test_measures_hosts_and_models_presets(cli, devices, cluster_file, tmp_path):
    out = tmp_path / "p.json"
    code, stdout, stderr = cli("profile", "--cluster", cluster_file, "--model", "tiny-mlp", "--batch-sizes", "1,4",
                               "--repeats", "2", "--warmup", "0", "--out", out)
    assert code == 0, stderr
    p = load(out, Profile)
    assert p.source == "measured" and [d.source for d in p.devices] == ["measured", "measured", "preset"]
    assert "measuring 2 of 3 devices" in stderr and "wrote" in stderr
    assert "measured:fast" in stdout and "fast <-> slow" in stdout and "jetson-nano" in stdout
    settings = devices["calls"][0]["settings"]
    assert (settings.repeats, settings.warmup, settings.threads) == (2, 0, None)
    assert devices["calls"][0]["measure_links"] is True and devices["calls"][0]["force"] is False


def test_a_failed_device_is_named_exit_1_and_the_profile_keeps_the_others(cli, devices, cluster_file, tmp_path):
    devices["slow"].refuse = "unreachable: nothing accepts SSH connections at 10.0.0.3:22 (connection refused)"
    out = tmp_path / "p.json"
    code, stdout, stderr = cli("profile", "--cluster", cluster_file, "--model", "tiny-mlp", "--batch-sizes", "1,4",
                               "--repeats", "2", "--out", out, "--json")
    assert code == 1
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 device could not be profiled: slow: unreachable") and str(out) in last
    summary = json.loads(stdout)
    assert summary["failures"] == {"slow": devices["slow"].refuse}
    assert summary["missing_devices"] == [{"name": "slow", "reason": devices["slow"].refuse}]
    p = load(out, Profile)
    assert [d.name for d in p.devices] == ["fast", "nano0"] and p.missing_devices[0].name == "slow"


def test_no_device_profiled_is_exit_1_without_a_file(cli, devices, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: c\ndevices:\n  - {name: fast, host: 10.0.0.2}\n")
    devices["fast"].refuse = "authentication refused at 10.0.0.2:22"
    out = tmp_path / "p.json"
    code, _, stderr = cli("profile", "--cluster", path, "--model", "tiny-mlp", "--batch-sizes", "1", "--out", out)
    assert code == 1 and "no device could be profiled: fast: authentication refused" in stderr
    assert not out.exists()


def test_json_without_out_prints_the_measured_profile(cli, devices, cluster_file):
    code, stdout, _ = cli("profile", "--cluster", cluster_file, "--model", "tiny-mlp", "--batch-sizes", "2",
                          "--repeats", "1", "--no-links", "--json", "--force", "--threads", "2")
    assert code == 0
    p = Profile.model_validate(json.loads(stdout))
    assert p.devices[0].measurement.threads == 2 and all(l.source != "measured" for l in p.links)
    assert devices["calls"][0]["force"] is True and devices["calls"][0]["measure_links"] is False


@pytest.mark.parametrize("args, needle", [(["--repeats", "0"], "repeats"), (["--threads", "0"], "--threads")])
def test_bad_probe_settings_exit_2(cli, devices, cluster_file, args, needle):
    code, _, stderr = cli("profile", "--cluster", cluster_file, "--model", "tiny-mlp", "--json", *args)
    assert code == 2 and needle in stderr


def test_plan_and_simulate_read_a_measured_profile_unchanged(cli, devices, cluster_file, tmp_path):
    devices["slow"].killed_at = 16  # a shorter grid on one device, as when memory runs out
    out = tmp_path / "p.json"
    code, _, stderr = cli("profile", "--cluster", cluster_file, "--model", "tiny-mlp", "--batch-sizes", "1,4,16",
                          "--repeats", "2", "--out", out)
    assert code == 0, stderr
    p = load(out, Profile)
    assert [d.batch_sizes for d in p.devices] == [[1, 4, 16], [1, 4], [1, 4, 16]]
    plan = tmp_path / "plan.yaml"
    code, stdout, stderr = cli("plan", "--profile", out, "--global-batch", "32", "--micro-batch", "8", "--out", plan)
    assert code == 0, stderr
    code, stdout, stderr = cli("plan", "--profile", out, "--global-batch", "32", "--micro-batch", "8", "--compare",
                               "--json")
    assert code == 0 and json.loads(stdout)
    code, _, stderr = cli("simulate", "--plan", plan, "--profile", out, "--json")
    assert code == 0, stderr


def test_a_link_whose_server_saw_only_strangers_is_one_line_and_the_devices_stay(cli, devices, cluster_file, tmp_path):
    # what netprobe's server prints when only other addresses connected (test_netprobe_hostile.py)
    devices["slow"].link_failure = ("LinkFailure: no connection from the prober addr-fast before the deadline "
                                    "(refused 2 connection(s) from 10.9.9.9)")
    out = tmp_path / "p.json"
    code, stdout, stderr = cli("profile", "--cluster", cluster_file, "--model", "tiny-mlp", "--batch-sizes", "1",
                               "--repeats", "1", "--out", out, "--json")
    assert code == 1 and "Traceback" not in stderr  # exit 1 as for any link that could not be measured
    assert json.loads(stdout)["failures"] == {"fast-slow link": devices["slow"].link_failure}
    assert [line for line in stderr.splitlines() if "10.9.9.9" in line]  # said, on its own line
    p = load(out, Profile)
    assert [d.name for d in p.devices] == ["fast", "slow", "nano0"]
    assert all(l.source != "measured" for l in p.links)  # the inventory's figure stands in
