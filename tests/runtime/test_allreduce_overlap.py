"""Tier 2 (gloo): the gradient AllReduce of a replicated stage starts within its last backward
(runtime/reducer.py), and the parameters still equal the single-process reference.

One run checks both: real workers over gloo with `--trace` and one parameter per bucket, so each
replicated stage has several buckets, and one replica of the tail stage has no samples (its buckets
are all started at `AR`, as zeros, in the same order as its peer's from the hooks)."""

from __future__ import annotations

import pytest

from hppctl.runtime.config import TrainOptions
from hppctl.runtime.session import RunRequest, Session
from tests.runtime.factories import local_cluster, make_plan
from tests.runtime.reference import train_reference
from tests.runtime.test_equivalence import assert_same

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]


def device_spans(trace: dict) -> dict[str, list[dict]]:
    """Complete events by the name of their thread in the "devices" process."""
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 1}
    out: dict[str, list[dict]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["pid"] == 1:
            out.setdefault(names[e["tid"]], []).append(e)
    return out


def test_buckets_start_within_the_last_backward_and_parameters_equal_the_reference():
    plan = make_plan("tiny-mlp", [((0, 2), ["a", "b"], [3, 1]), ((2, 5), ["c", "d"], [4, 0])],
                     global_batch=16, micro_batch=4)
    options = TrainOptions(rounds=3, threads=1, dataset="synthetic", lr=0.1, trace=True, allreduce_bucket_bytes=1)
    result = Session(RunRequest(plan, local_cluster(*plan.devices()), options)).run()
    assert_same(result.model_state(), train_reference(plan, options))

    spans = device_spans(result.trace)
    for device, params in (("a", 2), ("c", 4)):  # Linear(32, 64) | Linear(64, 64), ReLU, head
        buckets = [e for e in spans[f"{device}: AllReduce buckets"] if e["cat"] == "allreduce"]
        assert len(buckets) == 3 * params
        backwards = sorted((e for track, es in spans.items() if track.startswith("stage") and f": {device} (" in track
                            for e in es if e["cat"] == "backward"), key=lambda e: e["ts"])
        for r in range(3):  # every round: bucket 0 started before the last backward ended
            last_backward = backwards[4 * r + 3]
            first_bucket = min((e for e in buckets[r * params:(r + 1) * params]), key=lambda e: e["ts"])
            assert first_bucket["name"].endswith("bucket 0")
            assert first_bucket["ts"] < last_backward["ts"] + last_backward["dur"], (device, r)
    # "d" has no samples: no backward, every bucket started at AR, in the peer's order
    d_buckets = [e["name"] for e in spans["d: AllReduce buckets"]]
    assert d_buckets == [e["name"] for e in spans["c: AllReduce buckets"]]
