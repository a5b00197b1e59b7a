"""Shared pieces of the recovery tests: preset profiles for their tiny plans (re-planning needs the profile a plan
was made from), and the processes a launcher forked (to kill a worker mid-run)."""

from __future__ import annotations

import os
from pathlib import Path

from hppctl.models.cluster import ClusterSpec, DeviceSpec
from hppctl.models.profile import Profile


def preset_profile(model: str, presets: dict[str, str], granularity: str = "fine") -> Profile:
    """`presets`: device name -> preset name (e.g. {"a": "jetson-nano"})."""
    from hppctl.driver import model_layers
    from hppctl.profiling.from_presets import build_preset_profile

    cluster = ClusterSpec(name="recovery", devices=[DeviceSpec(name=d, preset=p) for d, p in presets.items()])
    layers, parts = model_layers(model, granularity)
    return build_preset_profile(cluster, layers, model=model, granularity=granularity, parts=parts)


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc: the tests find forked workers by their launcher)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found
