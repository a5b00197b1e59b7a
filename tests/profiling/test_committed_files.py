"""The cluster files and the example profile committed in profiles/ load, and match the presets."""

from pathlib import Path

import pytest

from hppctl.models.cluster import ClusterSpec
from hppctl.models.profile import Profile
from hppctl.profiling.from_presets import build_preset_profile, resolve_presets
from hppctl.store import load

PROFILES = Path(__file__).resolve().parents[2] / "profiles"

# Asteroid (MobiCom'24) Table 6
TABLE6 = {
    "env-a": ({"jetson-nano": 5}, 12.5e6),
    "env-b": ({"jetson-nx": 3, "jetson-tx2": 2}, 12.5e6),
    "env-b-1000": ({"jetson-nx": 3, "jetson-tx2": 2}, 125e6),
    "env-c": ({"jetson-nx": 1, "jetson-tx2": 2, "jetson-nano": 3}, 12.5e6),
    "env-d": ({"jetson-tx2": 1, "jetson-nano": 3}, 12.5e6),
}


@pytest.mark.parametrize("name", sorted(TABLE6))
def test_table6_environments(name):
    spec = load(PROFILES / f"{name}.yaml", ClusterSpec)
    counts, bandwidth = TABLE6[name]
    assert spec.name == name and spec.bandwidth == bandwidth and spec.links == []
    found: dict[str, int] = {}
    for d in spec.devices:
        found[d.preset] = found.get(d.preset, 0) + 1
        assert d.memory is None  # budgets come from the presets
    assert found == counts
    resolve_presets(spec)


def test_example_cluster_loads_and_resolves():
    spec = load(PROFILES / "example.yaml", ClusterSpec)
    assert [p.name for p in resolve_presets(spec)] == ["jetson-tx2", "jetson-nano", "rpi4"]
    assert spec.bandwidth_between("nano0", "pi0") == 50e6 / 8


def test_example_profile_loads_and_is_current_with_the_presets():
    path = PROFILES / "example-tiny.json"
    profile = load(path, Profile)
    assert profile.source == "preset" and profile.cluster == "example" and profile.model == "tiny-cnn"
    spec = load(PROFILES / "example.yaml", ClusterSpec)
    rebuilt = build_preset_profile(spec, profile.layers, model=profile.model, granularity=profile.granularity,
                                   batch_sizes=profile.devices[0].batch_sizes,
                                   optimizer_state_factor=profile.optimizer_state_factor)
    assert rebuilt == profile, (
        "profiles/example-tiny.json is stale; regenerate it with: "
        "hppctl profile --cluster profiles/example.yaml --model tiny-cnn --out profiles/example-tiny.json")
