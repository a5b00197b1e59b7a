"""Chrome trace events: checked against the Trace Event Format (JSON object form) that Perfetto reads."""

import json
import numbers

import pytest

from hppctl.schedule.trace import chrome_trace
from tests.schedule.factories import FixedTimings
from tests.schedule.test_simulate import run

METADATA_NAMES = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def validate_trace_event_format(doc: dict) -> None:
    """The rules of the Trace Event Format document for the phases we emit (X, M, C)."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    named_threads = set()
    for e in doc["traceEvents"]:
        assert isinstance(e["name"], str) and e["name"], e
        assert e["ph"] in ("X", "M", "C"), e
        assert isinstance(e["pid"], int), e
        assert isinstance(e.get("args", {}), dict), e
        if e["ph"] == "X":  # complete event: ts and dur in microseconds, on a thread
            assert isinstance(e["ts"], numbers.Real) and e["ts"] >= 0, e
            assert isinstance(e["dur"], numbers.Real) and e["dur"] >= 0, e
            assert isinstance(e["tid"], int) and isinstance(e["cat"], str), e
        elif e["ph"] == "M":
            assert e["name"] in METADATA_NAMES, e
            if e["name"].startswith("thread_"):
                assert isinstance(e["tid"], int)
            if e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
            key = "name" if e["name"].endswith("_name") else "sort_index"
            assert key in e["args"], e
        else:  # counter: numeric series in args
            assert isinstance(e["ts"], numbers.Real) and e["ts"] >= 0
            assert e["args"] and all(isinstance(v, numbers.Real) for v in e["args"].values()), e
    spans = [(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "X"]
    assert set(spans) <= named_threads, "every span sits on a named thread"


@pytest.fixture(scope="module")
def traced():
    result = run([[3, 5], [8], [2, 2, 4]], 5, FixedTimings([1, 2, 1], [2, 3, 2], [0.5, 0.5], allreduce=[1, 0, 1]),
                 trace=True)
    from tests.schedule.factories import make_schedule
    return result, chrome_trace(result, make_schedule([[3, 5], [8], [2, 2, 4]], 5))


def test_trace_follows_the_trace_event_format(traced):
    result, doc = traced
    validate_trace_event_format(json.loads(json.dumps(doc)))


def test_one_track_per_device_and_per_link(traced):
    result, doc = traced
    names = {(e["pid"], e["args"]["name"]) for e in doc["traceEvents"] if e["name"] == "thread_name"}
    devices = {n for pid, n in names if pid == 1}
    links = {n for pid, n in names if pid == 2}
    assert len(devices) == 6 and "stage 1: d2 (8 samples)" in devices
    assert links == {"d0->d2", "d1->d2", "d2->d0", "d2->d1", "d2->d3", "d2->d4", "d2->d5",
                     "d3->d2", "d4->d2", "d5->d2"}


def test_spans_fit_in_the_round_and_cover_every_compute(traced):
    result, doc = traced
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert max(e["ts"] + e["dur"] for e in spans) <= result.round_latency_s * 1e6 + 1e-3
    assert sum(1 for e in spans if e["cat"] in ("forward", "backward")) == 6 * 5 * 2
    assert sum(1 for e in spans if e["cat"] == "allreduce") == 2 + 3
