"""Env D on the edge lab (1 jetson-tx2 + 3 jetson-nano presets, 100 Mbit/s, workers over SSH in each
host's namespace and cgroup): one host's link is cut (`ip link set eth0 down` inside its network
namespace) in the middle of training; the coordinator suspects it, its probe times out, the light
re-plan moves its layers to the neighbours (from the backup on the next stage), and the run ends with
the parameters of the failure-free single-process loop. Needs root; a minute or two. Recovery times:
bench/recovery.py and docs/fault-tolerance.md. No wall-clock assertions.
"""

from __future__ import annotations

import pytest

from hppctl.models.cluster import ClusterSpec
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.recovery import RecoveryOptions, ResilientSession
from hppctl.runtime.session import RunRequest
from hppctl.store import load
from tests.recovery.factories import preset_profile
from tests.recovery.test_replay import assert_same
from tests.runtime.factories import make_plan
from tests.runtime.reference import train_reference

pytestmark = [pytest.mark.lab, pytest.mark.gloo, pytest.mark.timeout(900)]

NAME = "pytest-recovery"
SPEC = f"""\
name: {NAME}
bandwidth: 100mbit
subnet: {{subnet}}
hosts:
  - {{name: tx0, preset: jetson-tx2}}
  - {{name: nano0, preset: jetson-nano}}
  - {{name: nano1, preset: jetson-nano}}
  - {{name: nano2, preset: jetson-nano}}
"""
PRESETS = {"tx0": "jetson-tx2", "nano0": "jetson-nano", "nano1": "jetson-nano", "nano2": "jetson-nano"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from hppctl.cli import run
    from tests.lab.conftest import free_subnet, lab_unavailable_reason

    reason = lab_unavailable_reason()
    if reason:
        pytest.skip(f"lab tests need root, tools and cgroups: {reason}")
    root = tmp_path_factory.mktemp("recovery-lab")
    (root / "lab.yaml").write_text(SPEC.replace("{subnet}", free_subnet()))
    state_dir, cluster_file = root / "state", root / "cluster.yaml"
    run(["lab", "down", "--name", NAME, "--state-dir", str(state_dir)])
    assert run(["lab", "up", "--spec", str(root / "lab.yaml"), "--out", str(cluster_file),
                "--state-dir", str(state_dir)]) == 0
    yield load(cluster_file, ClusterSpec)
    run(["lab", "down", "--name", NAME, "--state-dir", str(state_dir)])


def cut_link(host: str) -> None:
    from hppctl.lab.layout import netns_name
    from hppctl.lab.system import sh

    sh(["ip", "-n", netns_name(NAME, host), "link", "set", "eth0", "down"])


def test_a_cut_link_is_detected_replanned_and_replayed(lab):
    plan = make_plan("tiny-mlp", [((0, 2), ["tx0"], [4]), ((2, 3), ["nano0"], [4]), ((3, 4), ["nano1"], [4]),
                                  ((4, 5), ["nano2"], [4])], global_batch=16, micro_batch=4)
    options = TrainOptions(rounds=10, dataset="digits", lr=0.1, timeout_s=120)
    session = ResilientSession(RunRequest(plan, lab, options),
                               RecoveryOptions(profile=preset_profile("tiny-mlp", PRESETS), timeout_s=3.0))
    cut: list[str] = []

    def on_round(row: dict) -> None:
        if row["round"] == 3 and not cut:
            cut.append("nano1")
            cut_link("nano1")

    result = session.run(on_round=on_round)
    kinds = [e["event"] for e in session.events]
    assert kinds.index("suspected") < kinds.index("lost") < kinds.index("replanned") < kinds.index("resumed")
    (lost,) = [e for e in session.events if e["event"] == "lost"]
    assert lost["device"] == "nano1" and lost["reason"] == "probe unanswered"
    assert "nano1" not in session.plan.devices()
    assert [row["round"] for row in result.rounds] == list(range(options.rounds))
    assert_same(result.model_state(), train_reference(plan, options))
