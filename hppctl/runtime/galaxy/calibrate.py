"""CPU seconds each device spends per byte of communication, measured over the cluster's own links:
what the inference planner charges a device without a spare core (docs/galaxy.md, "Why the overlap
did not pay").

    profile = calibrate_comm_cpu(profile, cluster, seq_len=284)   # the same profile, fields filled

`hppctl profile --seq-len` runs it after the block probes (profiling/inference.py measures one device at
a time and sits below the runtime, so the CLI chains the two).

Two short inference runs of one layer of the profiled model on every measured device, with
`hppctl run`'s own runtime (runtime/galaxy/launch.py): galaxy's split on plain rings, then on gloo's
AllReduce. In those modes a collective computes nothing, so the process CPU (every thread: the Python
side and gloo's I/O threads) the ring spends inside it, divided by the bytes it sent plus received,
is the device's CPU per byte (ring.Stats). The median over the passes goes into the profile as
`comm_cpu_s_per_byte` and `allreduce_cpu_s_per_byte`.

Why not a loopback transfer inside the block probe: over a shaped link the CPU per byte is set by how
often the receiving thread wakes up for the few packets that arrived (measured on the lab: ~2 ns/byte
for the ring, 8x what the same transfer costs over loopback), and only a real peer over the real link
shows it.
"""

from __future__ import annotations

import statistics
from typing import Any

from hppctl.models.cluster import ClusterSpec
from hppctl.models.inference import InferenceProfile


def per_byte(reports: dict[str, dict], kind: str) -> dict[str, float]:
    """Median over passes of CPU seconds per byte sent + received in `kind` collectives, per device."""
    out = {}
    for device, report in reports.items():
        rates = [p[f"{kind}_cpu_s"] / p[f"{kind}_bytes"] for p in report["passes"] if p.get(f"{kind}_bytes")]
        if rates:
            out[device] = statistics.median(rates)
    return out


def calibrate_comm_cpu(profile: InferenceProfile, cluster: ClusterSpec, *, seq_len: int, repeats: int = 3,
                       wire_dtype: str = "float32", threads: int = 0, timeout_s: float = 900.0,
                       env: dict[str, str] | None = None) -> InferenceProfile:
    """`profile` with each measured device's CPU per byte of ring and AllReduce communication; unchanged
    when fewer than two devices are measured (nothing to communicate with) or galaxy has no plan."""
    from hppctl.errors import Infeasible
    from hppctl.planner.galaxy import make_inference_plan
    from hppctl.runtime.galaxy.launch import InferenceRequest, run_inference  # the module imports this one lazily

    measured = [d.name for d in profile.devices if d.source == "measured"]
    if len(measured) < 2:
        return profile
    sub = profile.model_copy(update={"devices": [d for d in profile.devices if d.name in measured], "num_layers": 1})
    try:
        plan = make_inference_plan(sub, "galaxy", seq_len)
    except Infeasible:
        return profile
    rates: dict[str, dict[str, float]] = {}
    for collective, kind in (("ring", "ring"), ("all-reduce", "allreduce")):
        run = plan.model_copy(update={"collective": collective, "overlap": False, "block_overlap": [False] * 4,
                                      "memory_violations": []})
        result = run_inference(InferenceRequest(run, cluster, None, overlap=True, repeats=repeats, warmup=1,
                                                wire_dtype=wire_dtype, threads=threads, timeout_s=timeout_s,
                                                env=dict(env or {})))
        rates[kind] = per_byte(result.reports, kind)
    devices = []
    for d in profile.devices:
        update: dict[str, Any] = {}
        if d.name in rates["ring"]:
            update["comm_cpu_s_per_byte"] = rates["ring"][d.name]
        if d.name in rates["allreduce"]:
            update["allreduce_cpu_s_per_byte"] = rates["allreduce"][d.name]
        devices.append(d.model_copy(update=update))
    return profile.model_copy(update={"devices": devices})
