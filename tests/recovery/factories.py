"""Preset profiles for the recovery tests' tiny plans: re-planning needs the profile a plan was made from."""

from __future__ import annotations

from hppctl.models.cluster import ClusterSpec, DeviceSpec
from hppctl.models.profile import Profile


def preset_profile(model: str, presets: dict[str, str], granularity: str = "fine") -> Profile:
    """`presets`: device name -> preset name (e.g. {"a": "jetson-nano"})."""
    from hppctl.driver import model_layers
    from hppctl.profiling.from_presets import build_preset_profile

    cluster = ClusterSpec(name="recovery", devices=[DeviceSpec(name=d, preset=p) for d, p in presets.items()])
    layers, parts = model_layers(model, granularity)
    return build_preset_profile(cluster, layers, model=model, granularity=granularity, parts=parts)
