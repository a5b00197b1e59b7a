"""profile_cluster with fake endpoints: parallel devices, presets beside measured devices, failures,
links, the cache (reruns, --force, resume after an interruption) and out-of-memory batch sizes."""

import pytest

from hppctl import __version__
from hppctl.models.cluster import ClusterSpec
from hppctl.profiling.cluster import Observer, ProbeSettings, profile_cluster
from hppctl.profiling.probe import PROBE_VERSION
from hppctl.zoo import layer_costs
from tests.profiling.fakes import FakeDevice, factory

SETTINGS = ProbeSettings(repeats=3, warmup=1, window_s=0.1)
GRID = [1, 4, 16]


def cluster(*names, preset: bool = False, **memory) -> ClusterSpec:
    devices = [{"name": n, "host": f"10.0.0.{i + 2}", "memory": memory.get(n)} for i, n in enumerate(names)]
    devices = [{k: v for k, v in d.items() if v is not None} for d in devices]
    if preset:
        devices.append({"name": "nano0", "preset": "jetson-nano"})
    return ClusterSpec.model_validate({"name": "fake", "bandwidth": "100mbit", "devices": devices,
                                       "links": [{"between": [names[0], names[1]], "bandwidth": "40mbit"}]})


def run(c, devices, tmp_path, **kw):
    make = factory(devices)
    kw.setdefault("settings", SETTINGS)
    result = profile_cluster(c, "tiny-mlp", batch_sizes=GRID, cache_root=tmp_path / "cache", endpoint_factory=make, **kw)
    return result, make


def train_calls(device: FakeDevice) -> list[dict]:
    return [args for kind, args in device.calls if kind == "train"]


def test_measured_and_preset_devices_in_one_profile(tmp_path):
    devices = {"fast": FakeDevice(quota=1.0), "slow": FakeDevice(quota=0.25), "mid": FakeDevice(quota=0.5)}
    result, make = run(cluster("fast", "slow", "mid", preset=True), devices, tmp_path)
    p = result.profile
    assert result.failures == {} and p.source == "measured" and p.missing_devices == []
    assert [d.name for d in p.devices] == ["fast", "slow", "mid", "nano0"]
    assert [d.source for d in p.devices] == ["measured", "measured", "measured", "preset"]
    assert len(p.layers) == len(layer_costs("tiny-mlp", "fine")) == 5
    by_name = {d.name: d for d in p.devices}
    per_sample = {n: sum(f[-1] + b[-1] for f, b in zip(d.forward_s, d.backward_s)) for n, d in by_name.items()}
    assert per_sample["slow"] == pytest.approx(4 * per_sample["fast"])  # the fake's sustained factor is 1/quota
    assert per_sample["mid"] == pytest.approx(2 * per_sample["fast"])
    assert by_name["fast"].memory_bytes == 2 * 10**9 - 4 * 10**8  # cgroup limit minus the worker runtime
    assert by_name["nano0"].kind == "jetson-nano" and by_name["nano0"].batch_sizes == GRID
    # every device splits its backward: the measured ones as their probes measured it (the fake's
    # weight gradients are half its backward), the preset one as its preset predicts it
    assert all(d.weight_grad_s is not None and len(d.weight_grad_s) == 5 for d in p.devices)
    fast = by_name["fast"]
    assert [w for row in fast.weight_grad_s for w in row] == pytest.approx([b / 2 for row in fast.backward_s for b in row])
    assert by_name["nano0"].source == "preset" and 0 < by_name["nano0"].weight_grad_s[0][0] < by_name["nano0"].backward_s[0][0]
    assert all(e.closed for e in make.endpoints.values())


def test_links_are_measured_pairwise_and_presets_keep_the_inventory(tmp_path):
    devices = {"fast": FakeDevice(quota=1.0), "slow": FakeDevice(quota=0.25), "mid": FakeDevice(quota=0.5)}
    p = run(cluster("fast", "slow", "mid", preset=True), devices, tmp_path)[0].profile
    measured = {frozenset(l.between): l for l in p.links if l.source == "measured"}
    assert set(measured) == {frozenset(x) for x in (("fast", "slow"), ("fast", "mid"), ("slow", "mid"))}
    link = measured[frozenset(("fast", "slow"))]
    assert link.directed_bytes_per_s == pytest.approx([12e6 * 0.75, 12e6])  # fake rates follow the receiver
    assert link.bytes_per_s == min(link.directed_bytes_per_s) and link.rtt_s == pytest.approx(0.002)
    assert p.bandwidth_between("fast", "nano0") == 12.5e6  # preset: the inventory's default
    # the inventory's fast-slow override (40mbit) was measured instead
    assert p.bandwidth_between("fast", "slow") == link.bytes_per_s


def test_no_links_keeps_the_inventory(tmp_path):
    devices = {"a": FakeDevice(), "b": FakeDevice()}
    p = run(cluster("a", "b"), devices, tmp_path, measure_links=False)[0].profile
    assert [(l.between, l.bytes_per_s) for l in p.links] == [(["a", "b"], 5e6)]
    assert not any(kind.startswith("link-") for kind, _ in devices["a"].calls + devices["b"].calls)


def test_a_failed_device_is_missing_and_the_others_are_kept(tmp_path):
    devices = {"a": FakeDevice(), "b": FakeDevice(refuse="unreachable: connection refused"), "c": FakeDevice()}
    events = []

    class Recorder(Observer):
        def device_failed(self, name, reason):
            events.append(("failed", name, reason))

        def device_done(self, name, text):
            events.append(("done", name))

    result, _ = run(cluster("a", "b", "c"), devices, tmp_path, observer=Recorder())
    p = result.profile
    assert result.failures == {"b": "unreachable: connection refused"}
    assert [d.name for d in p.devices] == ["a", "c"]
    assert [(m.name, m.reason) for m in p.missing_devices] == [("b", "unreachable: connection refused")]
    assert [l.between for l in p.links] == [["a", "c"]]
    assert ("failed", "b", "unreachable: connection refused") in events and ("done", "a") in events


def test_every_device_failing_gives_no_profile(tmp_path):
    devices = {"a": FakeDevice(refuse="x"), "b": FakeDevice(refuse="y")}
    result, _ = run(cluster("a", "b"), devices, tmp_path)
    assert result.profile is None and result.failures == {"a": "x", "b": "y"}


def test_version_mismatch_names_both_versions(tmp_path):
    devices = {"a": FakeDevice(), "b": FakeDevice(version="0.0.1"), "c": FakeDevice(version=None)}
    result, _ = run(cluster("a", "b", "c"), devices, tmp_path)
    assert result.failures["b"].startswith(f"hppctl 0.0.1 on the device, {__version__} here")
    assert "--install" in result.failures["b"] and "not installed" in result.failures["c"]


def test_a_device_whose_probe_measures_otherwise_is_refused_before_it_measures(tmp_path):
    # the same hppctl version string, other code: an older checkout or wheel whose passes carry no
    # weight gradients (PROBE_VERSION 4 reported none), or a newer one
    devices = {"a": FakeDevice(), "b": FakeDevice(probe_version=None), "c": FakeDevice(probe_version=99)}
    result, _ = run(cluster("a", "b", "c"), devices, tmp_path)
    assert set(result.failures) == {"b", "c"} and [d.name for d in result.profile.devices] == ["a"]
    assert "probe version 4 or older" in result.failures["b"] and "--install" in result.failures["b"]
    assert f"probe version 99, this one with {PROBE_VERSION}" in result.failures["c"]
    assert train_calls(devices["b"]) == [] and train_calls(devices["c"]) == []  # nothing measured, nothing cached


def test_a_device_with_another_layer_table_is_refused(tmp_path):
    devices = {"a": FakeDevice(), "b": FakeDevice(layers=7)}
    result, _ = run(cluster("a", "b"), devices, tmp_path)
    assert "7 layers" in result.failures["b"] and "5" in result.failures["b"]


def test_a_rerun_measures_nothing_and_force_measures_everything(tmp_path):
    devices = {"a": FakeDevice(), "b": FakeDevice()}
    first, _ = run(cluster("a", "b"), devices, tmp_path)
    assert first.measured == {"a": GRID, "b": GRID} and first.cached == {"a": [], "b": []}
    second, _ = run(cluster("a", "b"), devices, tmp_path)
    assert second.measured == {"a": [], "b": []} and second.cached == {"a": GRID, "b": GRID}
    assert len(train_calls(devices["a"])) == 1
    assert second.profile.devices == first.profile.devices
    third, _ = run(cluster("a", "b"), devices, tmp_path, force=True)
    assert third.measured == {"a": GRID, "b": GRID} and len(train_calls(devices["a"])) == 2


def test_a_larger_grid_measures_only_the_new_batch_size(tmp_path):
    devices = {"a": FakeDevice(), "b": FakeDevice()}
    run(cluster("a", "b"), devices, tmp_path)
    make = factory(devices)
    result = profile_cluster(cluster("a", "b"), "tiny-mlp", batch_sizes=GRID + [64], settings=SETTINGS,
                             cache_root=tmp_path / "cache", endpoint_factory=make)
    assert result.measured["a"] == [64] and train_calls(devices["a"])[-1]["batch_sizes"] == [64]
    assert result.profile.devices[0].batch_sizes == GRID + [64]


def test_other_settings_are_another_cache_entry(tmp_path):
    devices = {"a": FakeDevice(), "b": FakeDevice()}
    run(cluster("a", "b"), devices, tmp_path)
    result, _ = run(cluster("a", "b"), devices, tmp_path, settings=ProbeSettings(repeats=4, warmup=1, window_s=0.1))
    assert result.measured["a"] == GRID


def test_an_interrupted_measurement_resumes_from_the_passes_it_kept(tmp_path):
    devices = {"a": FakeDevice(die_after_passes=5), "b": FakeDevice()}
    first, _ = run(cluster("a", "b"), devices, tmp_path)
    assert "connection lost" in first.failures["a"] and [d.name for d in first.profile.devices] == ["b"]
    devices["a"].die_after_passes = None
    second, _ = run(cluster("a", "b"), devices, tmp_path)
    assert second.failures == {}
    resumed = train_calls(devices["a"])[-1]
    # 5 passes were kept: rounds go 1, 4, 16, 1, 4 -> batch 1 and 4 need one more, 16 needs two
    assert resumed["passes"] == {"1": 1, "4": 1, "16": 2} and resumed["batch_sizes"] == GRID
    assert second.measured["a"] == GRID and second.cached["b"] == GRID


def test_a_batch_size_killed_for_memory_is_left_out_with_the_larger_ones(tmp_path):
    devices = {"a": FakeDevice(killed_at=16), "b": FakeDevice()}
    result, _ = run(cluster("a", "b"), devices, tmp_path)
    assert result.failures == {}
    a = result.profile.devices[0]
    assert a.batch_sizes == [1, 4] and any("left out" in n and "16" in n for n in a.measurement.notes)
    assert any("below 16" in n for n in result.notes)
    assert [c["batch_sizes"] for c in train_calls(devices["a"])] == [GRID, [1, 4]]
    # the skip is cached: a rerun does not try batch 16 again
    again, _ = run(cluster("a", "b"), devices, tmp_path)
    assert again.measured["a"] == [] and len(train_calls(devices["a"])) == 2


def test_out_of_memory_at_the_smallest_batch_fails_the_device(tmp_path):
    devices = {"a": FakeDevice(killed_at=1), "b": FakeDevice()}
    result, _ = run(cluster("a", "b"), devices, tmp_path)
    assert "killed at batch 1" in result.failures["a"]


def test_the_inventory_memory_is_the_budget_and_the_probes_limit(tmp_path):
    devices = {"a": FakeDevice(), "b": FakeDevice()}
    result, _ = run(cluster("a", "b", a=3 * 10**9), devices, tmp_path)
    assert result.profile.devices[0].memory_bytes == 3 * 10**9
    assert train_calls(devices["a"])[0]["memory_budget_bytes"] == 3 * 10**9
    assert train_calls(devices["b"])[0]["memory_budget_bytes"] == 2 * 10**9


def test_threads_option_reaches_the_probe(tmp_path):
    devices = {"a": FakeDevice(), "b": FakeDevice()}
    run(cluster("a", "b"), devices, tmp_path, settings=ProbeSettings(repeats=2, warmup=0, threads=3))
    identify = [args for kind, args in devices["a"].calls if kind == "identify"][0]
    assert identify["threads"] == 3 and train_calls(devices["a"])[0]["threads"] == 3


@pytest.mark.parametrize("kw", [{"repeats": 0}, {"warmup": -1}, {"threads": 0}, {"link_seconds": 0}])
def test_bad_settings(kw):
    from hppctl.errors import BadInput

    with pytest.raises(BadInput):
        ProbeSettings(**kw)
