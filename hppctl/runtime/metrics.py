"""Per-round metrics from the workers' reports, and the run's timeline in the simulator's trace format.

One metrics row per round (`--metrics F.jsonl`, one JSON object per line):

    {"round": 3, "epoch": 0, "loss": 1.93, "train_accuracy": 0.41, "lr": 0.05, "samples_per_s": 212.4,
     "round_s": 0.60, "bytes_sent": 3276800,
     "stages": [{"stage": 0, "devices": ["nx0", "tx0"], "compute_s": 0.41, "wait_s": 0.12, "allreduce_s": 0.03,
                 "bytes_sent": 1638400}, …],
     "devices": {"nx0": {"stage": 0, "compute_s": …, "wait_s": …, "allreduce_s": …, "step_s": …,
                         "bytes_sent": …, "rss_bytes": …, "peak_rss_bytes": …}, …}}

`loss` is the mean cross-entropy over the round's global batch (the tail devices' shares summed);
`round_s` is the time between the ends of consecutive rounds (the first round: from the earliest
start), the figure a steady pipeline delivers rounds at; `samples_per_s` = G / `round_s`. Stage
figures are the maximum over the stage's devices (sums for bytes).
"""

from __future__ import annotations

from hppctl.runtime.topology import Topology
from hppctl.schedule.trace import span_event, trace_header

DEVICE_FIELDS = ("duration_s", "cpu_s", "compute_s", "wait_s", "allreduce_s", "step_s", "bytes_sent", "rss_bytes", "peak_rss_bytes")


def aggregate(round_index: int, reports: dict[str, dict], topo: Topology, previous_end: float | None,
              rounds_per_epoch: int) -> dict:
    end = max(r["started_at"] + r["duration_s"] for r in reports.values())
    start = previous_end if previous_end is not None else min(r["started_at"] for r in reports.values())
    round_s = max(end - start, 1e-9)
    # The devices that computed the loss report samples: the tail stage's, or in a Bi-Partition plan
    # the backward owner of the last layer, which need not be the last worker.
    tails = [r for r in reports.values() if r["samples"]]
    samples = sum(r["samples"] for r in tails)
    stages = []
    for p, group in enumerate(topo.groups):
        rows = [reports[d] for d in group]
        stages.append({"stage": p, "devices": list(group),
                       **{k: max(r[k] for r in rows) for k in ("compute_s", "wait_s", "allreduce_s")},
                       "bytes_sent": sum(r["bytes_sent"] for r in rows)})
    return {
        "round": round_index,
        "epoch": round_index // rounds_per_epoch,
        "loss": sum(r["loss"] for r in tails),
        "train_accuracy": sum(r["correct"] for r in tails) / samples if samples else None,
        "lr": max((r["lr"] for r in reports.values() if "lr" in r), default=None),
        "samples_per_s": topo.global_batch / round_s,
        "round_s": round_s,
        "ended_at": end,
        "bytes_sent": sum(r["bytes_sent"] for r in reports.values()),
        "stages": stages,
        "devices": {d: {"stage": topo.stage_of[d], **{k: reports[d][k] for k in DEVICE_FIELDS}} for d in topo.devices},
    }


class TraceBuilder:
    """Chrome trace events of the real run, laid out like `hppctl simulate --trace`: process 1
    "devices" (one thread per device, head stage first: F, B, AR, STEP and waits), process 2 "links"
    (one thread per directed link: each transfer from the receive being posted to its arrival, as
    the receiver saw it). Times in microseconds from the first round's start."""

    def __init__(self, topo: Topology, title: str) -> None:
        self.topo, self.title = topo, title
        self.origin: float | None = None
        self.spans: list[tuple[float, dict, str]] = []

    def add(self, report: dict) -> None:
        if self.origin is None or report["started_at"] < self.origin:
            self.origin = report["started_at"]
        for span in report.get("spans", []):
            self.spans.append((report["started_at"], span, report["device"]))

    def document(self, extra: dict | None = None) -> dict:
        topo, origin = self.topo, self.origin or 0.0
        tid, events = trace_header(list(topo.devices), topo.stage_of, topo.samples, [s["track"] for _, s, _ in self.spans])
        for started_at, s, _ in self.spans:
            events.append(span_event(s["name"], s["category"], started_at - origin + s["start_s"], s["duration_s"],
                                     tid, s["track"], s.get("args", {})))
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"title": self.title, "source": "hppctl run", **(extra or {})}}
