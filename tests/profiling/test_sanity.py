"""Profile sanity checks (issue 25, item 6): implausible per-batch times are measured again once,
then marked and warned about by `hppctl profile` and `hppctl plan`; `local:` devices share this
machine's memory instead of each counting all of it."""

from __future__ import annotations

import pytest

from hppctl.models.cluster import ClusterSpec
from hppctl.models.profile import Profile
from hppctl.profiling.cluster import ProbeSettings, profile_cluster
from hppctl.profiling.sanity import implausible_batch_sizes, timing_warnings
from hppctl.store import save
from tests.conftest import make_profile
from tests.profiling.fakes import FakeDevice, factory

# the issue's measured tiny-mlp profile: ms per sample at batch 1, 16 and 256
ISSUE_MS_PER_SAMPLE = {1: 0.662, 16: 151.0, 256: 1.2}


def with_times(profile: Profile, device: int, ms_per_sample: dict[int, float]) -> Profile:
    """`profile` with one device's grid set to `ms_per_sample` (spread over its layers as before)."""
    d = profile.devices[device]
    layers = len(d.forward_s)
    sizes = sorted(ms_per_sample)
    per_layer = [ms_per_sample[b] * b / 1e3 / layers for b in sizes]  # seconds of one layer's fwd + bwd
    changed = d.model_copy(update={"batch_sizes": sizes, "forward_s": [[t / 3 for t in per_layer]] * layers,
                                   "backward_s": [[2 * t / 3 for t in per_layer]] * layers})
    devices = [*profile.devices[:device], changed, *profile.devices[device + 1:]]
    others = [x.model_copy(update={"batch_sizes": sizes, "forward_s": [r[:len(sizes)] for r in x.forward_s],
                                   "backward_s": [r[:len(sizes)] for r in x.backward_s]})
              if x is not changed else x for x in devices]
    return Profile.model_validate({**profile.model_dump(), "devices": [o.model_dump() for o in others]})


def test_the_issues_numbers_are_implausible_and_a_synthetic_profile_is_not():
    profile = make_profile(layers=4, speeds=(1.0, 2.0), grid=[1, 16, 256])
    assert timing_warnings(profile) == []
    bad = with_times(profile, 1, ISSUE_MS_PER_SAMPLE)
    assert implausible_batch_sizes(bad.devices[1]) == [1, 16, 256]
    [line] = timing_warnings(bad)
    name = bad.devices[1].name
    assert line.startswith(f"device {name}: implausible training times at batch sizes 1, 16, 256 (ms/sample 0.662 @1, "
                           f"151 @16, 1.2 @256: time per sample rises 228x from batch 1 to 16; a step at batch 256 "
                           f"takes 0.13 of one at 16)")


def test_plan_warns_about_a_profile_with_the_issues_numbers(cli, tmp_path):
    profile = with_times(make_profile(layers=4, speeds=(1.0, 2.0), grid=[1, 16, 256]), 1, ISSUE_MS_PER_SAMPLE)
    save(tmp_path / "p.json", profile)
    code, out, err = cli("plan", "--profile", tmp_path / "p.json", "--global-batch", "32", "--micro-batch", "16")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and f"device {profile.devices[1].name}: implausible training times at batch sizes 1, 16, 256" \
        in warnings[0]


SETTINGS = ProbeSettings(repeats=3, warmup=1, window_s=0.1)
GRID = [1, 4, 16]


def local_cluster(*names: str) -> ClusterSpec:
    return ClusterSpec.model_validate({"name": "here", "bandwidth": "1gbit",
                                       "devices": [{"name": n, "local": True} for n in names]})


def measure(cluster: ClusterSpec, devices: dict[str, FakeDevice], tmp_path):
    return profile_cluster(cluster, "tiny-mlp", batch_sizes=GRID, cache_root=tmp_path / "cache",
                           endpoint_factory=factory(devices), settings=SETTINGS, measure_links=False)


def test_three_local_devices_share_the_machines_memory(tmp_path):
    devices = {n: FakeDevice(memory_limit=None) for n in ("a", "b", "c")}  # MemAvailable: 6 GB (fakes.py)
    run = measure(local_cluster("a", "b", "c"), devices, tmp_path)
    budgets = [d.memory_bytes for d in run.profile.devices]
    assert sum(budgets) <= 6 * 10**9  # was 3 x (6 GB - the 0.4 GB worker runtime)
    assert budgets == [2 * 10**9 - 4 * 10**8] * 3
    assert all("shared by 3 devices" in d.measurement.memory_budget_source for d in run.profile.devices)
    assert any(n.startswith("a, b, c share this machine's 6.00 GB (MemAvailable): 2.00 GB each") for n in run.notes), run.notes


def test_a_local_device_with_an_inventory_memory_keeps_it(tmp_path):
    devices = {n: FakeDevice(memory_limit=None) for n in ("a", "b", "c")}
    cluster = ClusterSpec.model_validate({"name": "here", "devices": [
        {"name": "a", "local": True, "memory": "1GB"}, {"name": "b", "local": True}, {"name": "c", "local": True}]})
    by_name = {d.name: d.memory_bytes for d in measure(cluster, devices, tmp_path).profile.devices}
    assert by_name == {"a": 10**9, "b": 3 * 10**9 - 4 * 10**8, "c": 3 * 10**9 - 4 * 10**8}


def test_hosts_on_different_machines_keep_their_own_memory(tmp_path):
    devices = {n: FakeDevice(memory_limit=None) for n in ("a", "b")}
    cluster = ClusterSpec.model_validate({"name": "lab", "devices": [
        {"name": "a", "host": "10.0.0.2"}, {"name": "b", "host": "10.0.0.3"}]})
    assert [d.memory_bytes for d in measure(cluster, devices, tmp_path).profile.devices] == [6 * 10**9 - 4 * 10**8] * 2


@pytest.mark.parametrize("glitches, marked", [(1, False), (2, True)])
def test_implausible_times_are_measured_again_once_then_marked(tmp_path, glitches, marked):
    """Batch 4 is 100x slow in the first `glitches` train probes (a burst of other work)."""
    devices = {"a": FakeDevice(slow_batch=4, slow_runs=glitches)}
    run = measure(local_cluster("a"), devices, tmp_path)
    train = [args["batch_sizes"] for kind, args in devices["a"].calls if kind == "train"]
    assert train == [GRID, [1, 4, 16]]  # once more, the batch sizes around the glitch only
    assert any(n.startswith("a: batch sizes 1, 4, 16 measured again (time per sample rises") for n in run.notes)
    d = run.profile.devices[0]
    assert bool(timing_warnings(run.profile)) is marked
    assert any("implausible training times" in n for n in d.measurement.notes) is marked


def test_times_from_the_cache_are_marked_not_measured_again(tmp_path):
    devices = {"a": FakeDevice(slow_batch=4, slow_runs=2)}
    measure(local_cluster("a"), devices, tmp_path)
    calls = len(devices["a"].calls)
    again = measure(local_cluster("a"), devices, tmp_path)  # everything cached
    assert [k for k, _ in devices["a"].calls[calls:]] == ["identify"]
    assert len(timing_warnings(again.profile)) == 1


def test_layer_times_far_above_the_whole_steps_timed_with_them_are_implausible():
    """What this machine measured under load: smooth-looking layer sums can still be hundreds of
    times the whole steps the probe timed in the same rounds."""
    profile = make_profile(layers=4, speeds=(1.0, 2.0), grid=[1, 16, 256])
    d = profile.devices[0]
    sums = [sum(f[i] + b[i] for f, b in zip(d.forward_s, d.backward_s)) for i in range(3)]
    fine = d.model_copy(update={"train_step_s": [s * 1.1 for s in sums]})
    assert implausible_batch_sizes(fine) == []
    off = d.model_copy(update={"train_step_s": [sums[0], sums[1] / 10, sums[2]]})
    assert implausible_batch_sizes(off) == [16]
    assert "the layers sum to 10x a whole step at batch 16" in timing_warnings(
        profile.model_copy(update={"devices": [off, *profile.devices[1:]]}))[0]
