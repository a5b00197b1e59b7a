"""Chrome trace events (the JSON object format Perfetto and chrome://tracing open) for a simulated round.

Process 1 "devices" has one thread per device (head stage first) carrying F, B, AR and STEP spans,
plus one counter per device for the samples (or bytes) of activations in flight; process 2 "links"
has one thread per directed link `src->dst` carrying its transfers. Times are microseconds.
"""

from __future__ import annotations

from hppctl.models.reports import LANE_SUFFIX, allreduce_lane
from hppctl.models.schedule import Schedule
from hppctl.schedule.simulate import SimResult

DEVICES_PID, LINKS_PID = 1, 2


def chrome_trace(result: SimResult, schedule: Schedule, *, title: str = "hppctl simulate") -> dict:
    """{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}} for `result`."""
    order = [d for s in schedule.stages for d in s.devices]
    stage_of = {d: p for p, s in enumerate(schedule.stages) for d in s.devices}
    samples = {st.device: st.samples for st in result.devices}
    tid, events = trace_header(order, stage_of, samples, [f"{link.src}->{link.dst}" for link in result.links]
                               + [span.track for span in result.spans])
    for span in result.spans:
        events.append(span_event(span.name, span.category, span.start_s, span.duration_s, tid, span.track, span.args))
    for st in result.devices:
        per = st.activation_bytes_per_sample
        unit = "bytes" if per is not None else "samples"
        for t, samples in st.memory_samples:
            events.append({"name": f"activations in flight: {st.device}", "ph": "C", "ts": _us(t),
                           "pid": DEVICES_PID, "args": {unit: samples * per if per is not None else samples}})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"title": title, "policy": schedule.policy, "mode": result.mode,
                      "round_latency_s": result.round_latency_s,
                      "throughput_samples_per_s": result.throughput_samples_per_s},
    }


def trace_header(order: list[str], stage_of: dict[str, int], samples: dict[str, int],
                 tracks) -> tuple[dict[str, int], list[dict]]:
    """(thread id of every track, the metadata events) of the two processes: "devices", one thread
    per device in `order`, and "links", one per directed `src->dst` among `tracks`, in the devices'
    order. `hppctl simulate --trace` and `hppctl run --trace` (runtime/metrics.py) share the layout."""
    tid = {d: i + 1 for i, d in enumerate(order)}
    links = sorted({t for t in tracks if "->" in t},
                   key=lambda name: (order.index(name.split("->")[0]), order.index(name.split("->")[1])))
    tid.update({name: i + 1 for i, name in enumerate(links)})
    lanes = [allreduce_lane(d) for d in order if allreduce_lane(d) in set(tracks)]
    tid.update({name: len(order) + i + 1 for i, name in enumerate(lanes)})
    events: list[dict] = [
        _meta("process_name", DEVICES_PID, None, "devices"),
        _meta("process_sort_index", DEVICES_PID, None, 0, key="sort_index"),
        _meta("process_name", LINKS_PID, None, "links"),
        _meta("process_sort_index", LINKS_PID, None, 1, key="sort_index"),
    ]
    for d in order:
        events.append(_meta("thread_name", DEVICES_PID, tid[d], f"stage {stage_of[d]}: {d} ({samples[d]} samples)"))
        events.append(_meta("thread_sort_index", DEVICES_PID, tid[d], tid[d], key="sort_index"))
    for name in lanes:  # sorted just under its device
        events.append(_meta("thread_name", DEVICES_PID, tid[name], f"{name.removesuffix(LANE_SUFFIX)}: AllReduce buckets"))
        events.append(_meta("thread_sort_index", DEVICES_PID, tid[name], tid[name.removesuffix(LANE_SUFFIX)],
                            key="sort_index"))
    for name in links:
        events.append(_meta("thread_name", LINKS_PID, tid[name], name))
        events.append(_meta("thread_sort_index", LINKS_PID, tid[name], tid[name], key="sort_index"))
    return tid, events


def span_event(name: str, category: str, start_s: float, duration_s: float, tid: dict[str, int], track: str,
               args: dict) -> dict:
    """A complete ("X") event on `track`: a link's thread when it reads `src->dst`, else a device's."""
    pid = LINKS_PID if "->" in track else DEVICES_PID
    return {"name": name, "cat": category, "ph": "X", "ts": _us(start_s), "dur": _us(duration_s), "pid": pid,
            "tid": tid[track], "args": args}


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _meta(name: str, pid: int, tid: int | None, value, *, key: str = "name") -> dict:
    event = {"name": name, "ph": "M", "pid": pid, "args": {key: value}}
    if tid is not None:
        event["tid"] = tid
    return event
