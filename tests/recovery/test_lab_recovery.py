"""Env D on the edge lab (1 jetson-tx2 + 3 jetson-nano presets, 100 Mbit/s, workers over SSH in each
host's namespace and cgroup), issue 7's four failures, two per run: nano1's worker killed (SIGKILL)
as a single-device stage — together with tx0's link cut, devices that fail together and are seen
apart (a killed worker at once, a cut link after the timeout) — then nano2's frozen (SIGSTOP);
nano1's worker killed as one replica of a two-device stage, then nano2's link cut (`ip link set eth0
down` inside its network namespace).
Each time the coordinator suspects the device, confirms the loss, re-plans light and replays; the
run ends with the parameters of the failure-free single-process loop (tiny-mlp: no BatchNorm or
dropout, so every plan gives them). Needs root; ~30 s per run, most of it the workers' start-up on
the throttled hosts (importing torch takes ~9 s on a 0.28-core host). Recovery times:
bench/recovery.py and docs/fault-tolerance.md. No wall-clock assertions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from hppctl.lab.faults import inject
from hppctl.lab.manager import the_lab
from hppctl.models.cluster import ClusterSpec
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.ft_session import RecoveryOptions, FtSession
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


@dataclass(frozen=True)
class Lab:
    cluster: ClusterSpec
    state_dir: Path

    def fault(self, host: str, action: str) -> None:
        """What `hppctl lab fault HOST ACTION` does. Imported at the module's top, not here: a fault is
        sent from the coordinator's round callback, and a first import there (~0.5 s) let a
        25-ms-a-round run finish before the fault landed."""
        inject(the_lab(self.state_dir, NAME), host, action)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from tests.lab.conftest import built_lab

    with built_lab(tmp_path_factory, NAME, SPEC) as built:
        yield Lab(load(built.cluster_file, ClusterSpec), built.state_dir)


SINGLE = [((0, 2), ["tx0"], [4]), ((2, 3), ["nano0"], [4]), ((3, 4), ["nano1"], [4]), ((4, 5), ["nano2"], [4])]
REPLICATED = [((0, 2), ["tx0"], [4]), ((2, 4), ["nano0", "nano1"], [2, 2]), ((4, 5), ["nano2"], [4])]


@pytest.mark.parametrize("stages,failures", [
    # the failures as `hppctl lab fault` actions: SIGKILL (of a single-device stage or of a
    # replica), SIGSTOP, a cut link; each step of the list at once
    pytest.param(SINGLE, [[("kill", "nano1"), ("link-down", "tx0")], [("stop", "nano2")]],
                 id="sigkill-single-stage-with-a-link-cut-then-sigstop"),
    pytest.param(REPLICATED, [[("kill", "nano1")], [("link-down", "nano2")]], id="sigkill-one-replica-then-link-cut"),
])
def test_training_survives_each_failure_with_the_failure_free_parameters(lab, stages, failures):
    # Two failures per run, the second once the first recovery has resumed: the four cases in two lab
    # runs (a run's start-up on the throttled hosts is most of its time), and two recoveries in a row.
    plan = make_plan("tiny-mlp", stages, global_batch=16, micro_batch=4)
    # 40 rounds: a round takes ~25 ms here, and each fault must land while training still runs
    options = TrainOptions(rounds=40, dataset="digits", lr=0.1, timeout_s=120)
    session = FtSession(RunRequest(plan, lab.cluster, options),
                               RecoveryOptions(profile=preset_profile("tiny-mlp", PRESETS), timeout_s=3.0))
    pending = list(failures)
    faults = [fault for step in failures for fault in step]

    def on_round(row: dict) -> None:
        resumed = sum(e["event"] == "resumed" for e in session.events)
        if pending and row["round"] >= 2 + 4 * resumed and resumed == len(failures) - len(pending):
            for action, victim in pending.pop(0):
                lab.fault(victim, action)

    try:
        result = session.run(on_round=on_round)
    finally:
        for action, victim in faults:
            if action == "link-down":
                lab.fault(victim, "link-up")
    assert not pending
    lost = {e["device"]: e["reason"] for e in session.events if e["event"] == "lost"}
    victims = [victim for _, victim in faults]
    assert sorted(lost) == sorted(victims)
    for action, victim in faults:
        if action in ("stop", "link-down"):
            assert lost[victim] == "probe unanswered"  # a frozen process or a cut link answers no probe
    replanned = [e["lost"] for e in session.events if e["event"] == "replanned"]
    assert [sorted(devices) for devices in replanned] == [sorted(v for _, v in step) for step in failures]
    assert [e["event"] for e in session.events].count("resumed") == 2
    assert not set(victims) & set(session.plan.devices())
    assert [row["round"] for row in result.rounds] == list(range(options.rounds))
    assert_same(result.model_state(), train_reference(plan, options))
