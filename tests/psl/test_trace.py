"""`hppctl psl run --trace`: the batches and FedAvg as run, laid out as `hppctl psl simulate --trace`
(one row per client and helper). Refused before (exit 2: "the Chrome trace lays out HPP rounds only").
Here the layout from reports; a real run's trace: tests/runtime/test_schedule_matrix.py (psl × trace)."""

from __future__ import annotations

import pytest

from hppctl.models.reports import ClientBatch, HelperBatch, PslRoundReport
from hppctl.runtime.psl.session import round_segments, run_trace

PROCESS = {"rss_bytes": 1, "peak_rss_bytes": 1, "host": "here", "cgroup": ""}


def client(started_at: float) -> PslRoundReport:
    batch = ClientBatch(step=0, started_at=started_at, sent_s=0.1, activations_s=0.3, gradients_sent_s=0.5,
                        gradients_s=0.6, completion_s=0.7, loss=1.0, correct=1)
    return PslRoundReport(round=0, device="c0", role="client", started_at=started_at - 0.05, duration_s=0.9,
                          cpu_s=0.5, fedavg_s=0.1, batches=[batch], **PROCESS)


def helper(started_at: float) -> PslRoundReport:
    batch = HelperBatch(step=0, started_at=started_at, tasks=[("F", "c0", 0.15, 0.25, 0.15), ("B", "c0", 0.5, 0.55, 0.5)])
    return PslRoundReport(round=0, device="h0", role="helper", started_at=started_at - 0.05, duration_s=0.9,
                          cpu_s=0.2, fedavg_s=0.1, batches=[batch], **PROCESS)


def test_a_round_is_each_clients_three_steps_each_helpers_tasks_and_fedavg():
    assert round_segments(client(100.0)) == [
        ("c0", "part-1 fwd + upload (r)", "client", 100.0, pytest.approx(100.1)),
        ("c0", "part-3 fwd (l) + bwd (l') + upload", "client", pytest.approx(100.3), pytest.approx(100.5)),
        ("c0", "part-1 bwd (r') + step", "client", pytest.approx(100.6), pytest.approx(100.7)),
        ("c0", "FedAvg (round 0)", "fedavg", pytest.approx(100.75), pytest.approx(100.85))]
    assert round_segments(helper(100.0)) == [
        ("h0", "F:c0", "helper-F", pytest.approx(100.15), pytest.approx(100.25)),
        ("h0", "B:c0", "helper-B", pytest.approx(100.5), pytest.approx(100.55)),
        ("h0", "FedAvg (round 0)", "fedavg", pytest.approx(100.75), pytest.approx(100.85))]


def test_the_trace_has_a_row_per_device_and_counts_from_the_first_span():
    doc = run_trace(round_segments(client(100.0)) + round_segments(helper(100.02)), "t", rounds=1)
    rows = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert rows == {0: "c0", 1: "h0"} and doc["otherData"]["rounds"] == 1
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert min(e["ts"] for e in spans) == 0 and len(spans) == 7
    forward = next(e for e in spans if e["name"] == "F:c0")
    assert forward["tid"] == 1 and forward["ts"] == pytest.approx(170_000) and forward["dur"] == pytest.approx(100_000)
