"""Bi-Partition workers equal the single-process loop (rtol 1e-4 after 5 rounds).

In-process (threads over queues, tests/bipartition/threaded.py) for many range shapes, and one
plan with split layers through the real `hppctl run` path (local subprocesses, gloo).
"""

from __future__ import annotations

import pytest
import torch

from hppctl.runtime.bipartition import BiExecutor
from hppctl.runtime.config import TrainOptions
from tests.bipartition.factories import bi_plan
from tests.bipartition.threaded import train_threaded
from tests.runtime.reference import train_reference

ROUNDS = 5

# (forward cuts, backward cuts) over tiny-mlp's 5 fine layers (Linear, ReLU, Linear, ReLU, Linear);
# worker w forwards [f_w, f_{w+1}) and backwards [b_w, b_{w+1}).
SHAPES = {
    "layer-wise": ([0, 2, 5], [0, 2, 5]),
    "paper-like suffix split (backward of layer 1 on the head)": ([0, 1, 3, 5], [0, 2, 3, 5]),
    "suffix splits of two Linear layers, forward-only tail": ([0, 2, 4, 5], [0, 3, 5, 5]),
    "prefix split of a Linear layer": ([0, 3, 5], [0, 2, 5]),
    "prefix split (input sent with SX) and a forward-only tail": ([0, 2, 4, 5], [0, 1, 5, 5]),
    "forward-empty head (recomputes from the data)": ([0, 0, 3, 5], [0, 2, 4, 5]),
    "backward-empty middle (relays gradients)": ([0, 2, 3, 5], [0, 3, 3, 5]),
}


def assert_same(actual: dict, expected: dict) -> None:
    assert sorted(actual) == sorted(expected)
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("name", list(SHAPES))
def test_threaded_workers_equal_single_process(name):
    forward, backward = SHAPES[name]
    plan = bi_plan("tiny-mlp", forward, backward, [f"w{i}" for i in range(len(forward) - 1)],
                   global_batch=16, micro_batch=4)
    opts = TrainOptions(rounds=ROUNDS, threads=1, dataset="synthetic", lr=0.1)
    assert_same(train_threaded(plan, opts), train_reference(plan, opts))


def test_without_the_weight_send_back_the_forward_owner_drifts(monkeypatch):
    """The equivalence above depends on SW/RW: a forward owner that keeps its stale split-layer
    weights no longer matches the reference."""
    monkeypatch.setattr(BiExecutor, "_receive_weights", lambda self, a: None)
    plan = bi_plan("tiny-mlp", [0, 3, 5], [0, 2, 5], ["a", "b"], global_batch=16, micro_batch=4)
    opts = TrainOptions(rounds=ROUNDS, threads=1, dataset="synthetic", lr=0.1)
    with pytest.raises(AssertionError):
        assert_same(train_threaded(plan, opts), train_reference(plan, opts))


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_hppctl_run_with_split_layers_equals_single_process():
    """The `hppctl run` path: launcher, local worker subprocesses, gloo; a prefix split (SX inputs),
    a suffix split and weight send-back both ways."""
    from hppctl.runtime.session import RunRequest, Session
    from tests.runtime.factories import local_cluster

    plan = bi_plan("tiny-mlp", [0, 3, 4, 5], [0, 2, 5, 5], ["a", "b", "c"], global_batch=16, micro_batch=4)
    opts = TrainOptions(rounds=ROUNDS, threads=1, dataset="synthetic", lr=0.1)
    result = Session(RunRequest(plan, local_cluster(*plan.devices()), opts)).run()
    assert [row["round"] for row in result.rounds] == list(range(ROUNDS))
    assert_same(result.model_state(), train_reference(plan, opts))


def test_split_inputs_are_posted_before_the_first_action(monkeypatch):
    """gloo moves a message only once its receive is posted (executor._post_receives): RX too."""
    import tests.bipartition.threaded as threaded
    from hppctl.runtime.bipartition import SPLIT_INPUT_TAG

    events: list[tuple[str, str]] = []

    class Recording(threaded.QueueComm):
        def irecv(self, tensor, peer, tag):
            if SPLIT_INPUT_TAG <= tag < 2 * SPLIT_INPUT_TAG:
                events.append((self.me, "RX"))
            return super().irecv(tensor, peer, tag)

    forward = BiExecutor._forward

    def recording_forward(self, a):
        events.append((self.device, "F"))
        return forward(self, a)

    monkeypatch.setattr(threaded, "QueueComm", Recording)
    monkeypatch.setattr(BiExecutor, "_forward", recording_forward)
    plan = bi_plan("tiny-mlp", [0, 3, 5], [0, 2, 5], ["a", "b"], global_batch=16, micro_batch=4)
    train_threaded(plan, TrainOptions(rounds=1, threads=1, dataset="synthetic", lr=0.1))
    on_b = [kind for device, kind in events if device == "b"]
    assert on_b[:4] == ["RX"] * 4 and on_b.count("RX") == 4


def test_round_metrics_take_the_loss_from_whichever_worker_computed_it():
    """A forward-only last worker computes no loss: the previous one does (it backwards the last layer)."""
    from hppctl.runtime.metrics import aggregate
    from hppctl.runtime.topology import Topology
    from hppctl.schedule import schedule_for_plan

    plan = bi_plan("tiny-mlp", [0, 3, 4, 5], [0, 2, 5, 5], ["a", "b", "c"], global_batch=16, micro_batch=4)
    topo = Topology.of(schedule_for_plan(plan))
    base = dict(started_at=0.0, duration_s=1.0, cpu_s=0.5, compute_s=0.5, wait_s=0.1, allreduce_s=0.0, step_s=0.0,
                bytes_sent=0, rss_bytes=0, peak_rss_bytes=0, loss=0.0, correct=0, samples=0)
    reports = {d: dict(base) for d in "abc"}
    reports["b"].update(loss=2.3, correct=4, samples=16)
    row = aggregate(0, reports, topo, None, rounds_per_epoch=10)
    assert row["loss"] == 2.3 and row["train_accuracy"] == 0.25
