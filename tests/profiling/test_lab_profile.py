"""`hppctl profile` on a real 3-host edge lab (CPU quotas 1, 0.5 and 0.25 core, 100 Mbit/s), as a user
runs it: over SSH with fabric and host-key checking, in parallel, then the links. Needs root.

One lab serves the module (built once, ~2 s; ~1.5 min in all). The model is tiny-cnn so that the
slowest host spends its time starting torch, not training; bench/profile_speed.py and
docs/profiling.md measure mobilenetv2 at the acceptance's scale. No wall-clock assertions: the
checks are ratios between hosts measured side by side. The last test kills a host's sshd.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from hppctl.models.cluster import ClusterSpec
from hppctl.models.profile import Profile
from hppctl.store import load

pytestmark = [pytest.mark.lab, pytest.mark.alone]  # alone: the speeds are compared against the hosts' quotas

NAME = "pytest-prof"
SPEC = f"""\
name: {NAME}
bandwidth: 100mbit
subnet: {{subnet}}
hosts:
  - {{name: pfast, cpu: 1.0, memory: 1GB}}
  - {{name: pmid, cpu: 0.5, memory: 1GB}}
  - {{name: pslow, cpu: 0.25, memory: 1GB}}
"""
QUOTAS = {"pfast": 1.0, "pmid": 0.5, "pslow": 0.25}
ARGS = ["--model", "tiny-cnn", "--batch-sizes", "1,4", "--repeats", "3", "--warmup", "1", "--link-seconds", "1"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from tests.lab.conftest import built_lab

    with built_lab(tmp_path_factory, NAME, SPEC) as built:
        yield {"root": built.root, "state_dir": built.state_dir, "cluster_file": built.cluster_file,
               "cluster": load(built.cluster_file, ClusterSpec)}
    for name in QUOTAS:  # --install's venvs (the hosts share this machine's home)
        shutil.rmtree(Path.home() / ".cache" / "hppctl" / "devices" / name, ignore_errors=True)


@pytest.fixture
def cache_dir(lab, monkeypatch):
    monkeypatch.setenv("HPPCTL_CACHE_DIR", str(lab["root"] / "cache"))


@pytest.fixture(scope="module")
def first(lab):
    """The first profile of the lab (run once; later tests reuse its cache)."""
    out = lab["root"] / "first.json"
    result = subprocess.run(["hppctl", "profile", "--cluster", str(lab["cluster_file"]), *ARGS, "--out", str(out),
                             "--json"], capture_output=True, text=True,
                            env={**__import__("os").environ, "HPPCTL_CACHE_DIR": str(lab["root"] / "cache")})
    return {"code": result.returncode, "summary": json.loads(result.stdout or "{}"), "stderr": result.stderr,
            "out": out}


def test_every_host_is_measured_in_parallel_with_a_progress_bar_each(first):
    assert first["code"] == 0, first["stderr"]
    profile = load(first["out"], Profile)
    assert profile.source == "measured" and [d.name for d in profile.devices] == list(QUOTAS)
    assert all(d.source == "measured" and d.batch_sizes == [1, 4] for d in profile.devices)
    for name in QUOTAS:
        assert any(line.startswith(name) and "done:" in line for line in first["stderr"].splitlines())
    assert first["summary"]["measured"] == {n: [1, 4] for n in QUOTAS}
    for d in profile.devices:  # each layer's weight-gradient part of its backward, measured over SSH
        assert len(d.weight_grad_s) == 11 and all(0.0 <= w <= b for w_row, b_row in zip(d.weight_grad_s, d.backward_s)
                                                  for w, b in zip(w_row, b_row))
        assert sum(row[-1] for row in d.weight_grad_s) > 0


def test_speed_follows_the_cpu_quota(first):
    # Loose bounds: the machine is shared (other labs, other tests), and a busy machine gives the 1-core
    # host less than its core; bench/profile_speed.py measures the figures.
    profile = load(first["out"], Profile)
    by_name = {d.name: d for d in profile.devices}
    for name, quota in QUOTAS.items():
        m = by_name[name].measurement
        assert m.threads == 1 and m.clock == "cpu"
        low = 0.3 if quota == 1.0 else 0.75 * quota
        assert low <= m.cpu_quota_cores <= quota * 1.2, (name, m.cpu_quota_cores)
        # the sustained factor is wall/CPU of whole steps: ~1/quota, more if the machine is busy
        assert all(0.8 / quota <= f <= 3.0 / quota for f in m.sustained_factor), (name, m.sustained_factor)
    step = {n: d.train_step_s[-1] for n, d in by_name.items()}
    assert step["pfast"] < step["pslow"] and step["pmid"] < step["pslow"]
    # Quota ratio 4. Lower bound: the quotas act. Upper bound loose: contention hits the throttled
    # host hardest (a step that misses its share waits out the CFS period), and the CI machine may
    # be running a benchmark beside the suite (seen: 7.9 with tiny-cnn's 1 ms steps).
    assert 1.8 <= step["pslow"] / step["pfast"] <= 12.0


def test_links_are_measured_both_ways_at_most_the_shaped_rate_and_within_twenty_percent_of_it(first):
    # Below the rate: TCP/IP headers (~4.5 %) and probers under the hosts' CPU quotas on a shared machine;
    # 10.9 MB/s (87 %) was measured on the slower cores of 2026-11-27 with nothing else running.
    profile = load(first["out"], Profile)
    assert len(profile.links) == 3
    for link in profile.links:
        assert link.source == "measured" and link.rtt_s is not None and link.rtt_s < 0.01
        for rate in link.directed_bytes_per_s:
            assert 0.8 * 12.5e6 <= rate <= 12.5e6, (link.between, rate)


def test_a_rerun_takes_everything_from_the_cache(lab, first, cli, cache_dir, tmp_path):
    out = tmp_path / "again.json"
    code, stdout, stderr = cli("profile", "--cluster", lab["cluster_file"], *ARGS, "--no-links", "--out", out, "--json")
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary["measured"] == {n: [] for n in QUOTAS} and summary["cached"] == {n: [1, 4] for n in QUOTAS}
    assert "from the cache" in stderr
    again, before = load(out, Profile), load(first["out"], Profile)
    assert [d.forward_s for d in again.devices] == [d.forward_s for d in before.devices]


def test_plan_works_unchanged_on_the_measured_profile(first, cli):
    code, stdout, stderr = cli("plan", "--profile", first["out"], "--global-batch", "32", "--micro-batch", "4",
                               "--compare", "--json")
    assert code == 0, stderr
    assert json.loads(stdout)


def test_install_puts_this_hppctl_into_a_venv_on_the_host(lab, cli, cache_dir, tmp_path):
    cluster = lab["cluster"]
    one = tmp_path / "one.yaml"
    data = cluster.model_dump(mode="json")
    data["devices"] = [d for d in data["devices"] if d["name"] == "pfast"]
    one.write_text(json.dumps(data))
    one = one.rename(one.with_suffix(".json"))
    code, _, stderr = cli("profile", "--cluster", one, *ARGS, "--install", "--out", tmp_path / "p.json")
    assert code == 0, stderr
    [device] = load(tmp_path / "p.json", Profile).devices
    assert len(device.weight_grad_s) == 11  # this hppctl's probe measured it there
    python = Path.home() / ".cache" / "hppctl" / "devices" / "pfast" / "venv" / "bin" / "python"
    where = subprocess.run([str(python), "-c", "import hppctl; print(hppctl.__file__)"], capture_output=True,
                           text=True, check=True, cwd=tmp_path).stdout  # not this checkout's directory
    assert str(python.parent.parent) in where  # the wheel in the venv, not this checkout


def test_a_host_whose_sshd_is_killed_is_named_and_the_others_are_kept(lab, cli, cache_dir, tmp_path):
    state = json.loads((lab["state_dir"] / NAME / "state.json").read_text())
    [pid] = [h["sshd_pid"] for h in state["hosts"] if h["name"] == "pslow"]
    subprocess.run(["kill", str(pid)], check=True)
    out = tmp_path / "two.json"
    code, stdout, stderr = cli("profile", "--cluster", lab["cluster_file"], *ARGS, "--out", out)
    assert code == 1
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 device could not be profiled: pslow: unreachable"), last
    profile = load(out, Profile)
    assert [d.name for d in profile.devices] == ["pfast", "pmid"]
    assert [m.name for m in profile.missing_devices] == ["pslow"]
    assert [set(l.between) for l in profile.links] == [{"pfast", "pmid"}]
