"""bench/peers.py's stock peers start on a real 2-host lab: torch.distributed.run over the lab's SSH
(in each host's netns and cgroup), gloo on the lab interface, DDP and a 1F1B pipeline of a tiny
model for 2 steps; each reports per-step times and a first loss equal to the reference computed on
the same initial weights and samples (tiny-mlp has no BatchNorm or dropout, so one reference serves both)."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import pytest

from tests.lab.conftest import built_lab

pytestmark = pytest.mark.lab

BENCH = Path(__file__).resolve().parents[2] / "bench"
SPEC = """name: peerst28
bandwidth: 100mbit
subnet: {subnet}
hosts:
  - {name: a, cpu: 0.5, memory: 1GB}
  - {name: b, cpu: 0.5, memory: 1GB}
"""


def torchelastic_folders() -> set[Path]:
    return {p for folder in {Path("/tmp"), Path(tempfile.gettempdir())} for p in folder.glob("torchelastic_*")}


def bench_peers():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("peers", BENCH / "peers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with built_lab(tmp_path_factory, "peerst28", SPEC) as built:
        yield built


def test_ddp_and_1f1b_peers_train_on_the_lab_hosts(lab):
    from hppctl.models.cluster import ClusterSpec
    from hppctl.store import load

    peers = bench_peers()
    cluster = load(lab.cluster_file, ClusterSpec)
    args = peers.parse_args(["--model", "tiny-mlp", "--global-batch", "64", "--rounds", "2", "--warmup", "1",
                             "--timeout", "120"])
    ddp_layout, _ = peers.peer_layout("ddp", None, 5, 64, 2)
    reference = peers.reference_loss("tiny-mlp", "fine", ddp_layout, 64, 64)
    left_before = torchelastic_folders()
    ddp = peers.run_peer("ddp", cluster, ["a", "b"], None, 64, args, 29650)
    pipe = peers.run_peer("pipe-1f1b", cluster, ["a", "b"], "0:2,2:5", 16, args, 29651)
    # torch.distributed.run's log folders go with the run (80 were left in /tmp after one bench)
    assert torchelastic_folders() <= left_before
    for run in (ddp, pipe):
        assert len(run["step_s"]) == 2 and all(s > 0 for s in run["step_s"])
        assert len(run["losses"]) == 2
        assert run["losses"][0] == pytest.approx(reference, rel=1e-4)
        assert run["measured_samples_per_s"] > 0
