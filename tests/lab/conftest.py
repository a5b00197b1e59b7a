"""Lab fixtures: one real lab per test module (building one takes ~2 s), skipped with the reason
when this machine cannot build it (not root, a tool missing, no cpu/memory cgroup controllers)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from hppctl.errors import BadInput


def lab_unavailable_reason() -> str | None:
    """None when a lab can be built here, else why not (the skip reason)."""
    from hppctl.lab import cgroups, system

    try:
        system.require("the lab tests", system.BASE_TOOLS + (system.DELAY_LINE_TOOL,))
        cgroups.detect()
    except BadInput as e:
        return str(e)
    return None


@pytest.fixture(scope="session")
def lab_reason():
    return lab_unavailable_reason()


@pytest.fixture(autouse=True)
def _skip_lab_tests_without_root(request, lab_reason):
    if request.node.get_closest_marker("lab") and lab_reason:
        pytest.skip(f"lab tests need root, tools and cgroups: {lab_reason}")


def free_subnet() -> str:
    """A lab subnet no other lab on this machine uses right now (benchmarks may run beside the suite)."""
    from hppctl.lab import network

    return network.free_subnet()


@dataclass(frozen=True)
class BuiltLab:
    """A lab a test module brought up: its spec file, state dir, cluster file and subnet."""
    root: Path
    spec: Path
    state_dir: Path
    cluster_file: Path
    subnet: str


@contextmanager
def built_lab(tmp_path_factory, name: str, spec_template: str) -> Iterator[BuiltLab]:
    """Bring up the lab `spec_template` describes (its `{subnet}` filled with a free one) in a state
    dir of its own, skip with the reason when this machine cannot, and remove it afterwards.

    A crashed earlier run's lab of the same name and state dir is removed first."""
    from hppctl.cli import run

    reason = lab_unavailable_reason()
    if reason:
        pytest.skip(f"lab tests need root, tools and cgroups: {reason}")
    root = tmp_path_factory.mktemp(f"{name}-lab")
    subnet = free_subnet()
    spec = root / "lab.yaml"
    spec.write_text(spec_template.replace("{subnet}", subnet))
    lab = BuiltLab(root, spec, root / "state", root / "cluster.yaml", subnet)
    down = ["lab", "down", "--name", name, "--state-dir", str(lab.state_dir)]
    run(down)
    assert run(["lab", "up", "--spec", str(spec), "--out", str(lab.cluster_file),
                "--state-dir", str(lab.state_dir)]) == 0
    try:
        yield lab
    finally:
        run(down)


def checkout_cluster(lab: BuiltLab) -> Path:
    """A copy of `lab`'s cluster file whose hosts' `python:` runs this checkout's hppctl (the lab's
    hosts run the machine's installed one otherwise, which a worktree or another clone may not be)."""
    import sys

    import yaml

    root = Path(__file__).resolve().parents[2]
    wrapper = lab.root / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={root} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    doc = yaml.safe_load(lab.cluster_file.read_text())
    for device in doc["devices"]:
        device["python"] = str(wrapper)
    path = lab.root / "cluster-here.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path
