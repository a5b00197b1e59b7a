"""Measure an edge lab against its spec: egress rates, round-trip delays, CPU slowdowns, OOM.

    python bench/lab_check.py                 # the built-in spec below (needs root)
    python bench/lab_check.py --spec L.yaml   # any lab spec
    python bench/lab_check.py --json

Builds the lab in a temporary state directory, measures it from the outside as a user would
(probes started over SSH with fabric, see hppctl/lab/measure.py), prints each figure next to
what the spec asks for, and takes the lab down again. Takes about a minute for the default spec.

- rate: one TCP stream of --seconds (default 5) per host's default egress and per link override,
  goodput measured by the receiver. TCP/IP headers take ~4.4% of a 1500-byte frame, so goodput
  of an exact shaper reads ~95.6% of the configured rate.
- rtt: median of 30 one-byte TCP round trips; expected = the delays the two directions get.
- cpu: the same pure-Python loop on each host (and unconstrained on this machine); the slowdown
  against the lab's 1-core host should be 1/cpu. "cpu s / wall s" is the share of a core the
  process got, which should equal its quota and does not depend on how fast this CPU is today.
- oom: the host with the smallest memory limit allocates twice its limit; expected: killed, and
  the lab's oom_kill counter for it goes up by one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hppctl.lab import manager, measure  # noqa: E402
from hppctl.lab.network import free_subnet  # noqa: E402
from hppctl.lab.layout import plan_lab  # noqa: E402
from hppctl.models.cluster import ClusterSpec  # noqa: E402
from hppctl.models.lab import LabSpec  # noqa: E402
from hppctl.store import load  # noqa: E402

DEFAULT_SPEC = """\
name: lab-check
bandwidth: 100mbit
subnet: {subnet}
hosts:
  - {name: ref, cpu: 1.0, memory: 1GB}
  - {name: tx0, preset: jetson-tx2}
  - {name: nano0, preset: jetson-nano}
  - {name: nano1, cpu: 0.25, memory: 256MB, bandwidth: 50mbit, delay: 2ms}
links:
  - {between: [tx0, nano0], bandwidth: 20mbit, delay: 1ms}
"""
SPIN_ITERATIONS = 5_000_000


def rate_pairs(plan) -> list[tuple[str, str]]:
    """Each host's default egress (to the first peer without an override), then every override."""
    pairs = []
    for h in plan.hosts:
        peers = [p.name for p in plan.hosts if p.name != h.name
                 and plan.rate(h.name, p.name) == h.bandwidth_bytes_per_s]
        if peers:
            pairs.append((h.name, peers[0]))
    for link in plan.spec.links:
        if link.bandwidth is not None:
            a, b = link.between
            pairs.append((a, b))
    return pairs


def expected_rtt(plan, a: str, b: str) -> float:
    return plan.impairment(a, b).delay_s + plan.impairment(b, a).delay_s


def local_spin_seconds() -> float:
    """The workload on this machine with no quota: the 1-core reference."""
    out = subprocess.run([sys.executable, "-m", "hppctl.lab.probe", "spin", "--iterations", str(SPIN_ITERATIONS)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["seconds"]


def check(plan, cluster: ClusterSpec, state_root: Path, seconds: float) -> dict:
    rates = []
    for src, dst in rate_pairs(plan):
        got = measure.bandwidth(cluster, src, dst, seconds=seconds)
        want = plan.rate(src, dst)
        rates.append({"src": src, "dst": dst, "spec_mbit": want * 8e-6, "measured_mbit": got["bytes_per_s"] * 8e-6,
                      "ratio": got["bytes_per_s"] / want, "seconds": got["seconds"]})
    rtts = []
    names = [h.name for h in plan.hosts]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            got = measure.rtt(cluster, a, b, count=30)
            rtts.append({"a": a, "b": b, "spec_ms": expected_rtt(plan, a, b) * 1e3, "median_ms": got["median_s"] * 1e3,
                         "min_ms": got["min_s"] * 1e3})
    reference = min(local_spin_seconds() for _ in range(2))
    runs = {h.name: [] for h in plan.hosts}
    for _ in range(2):  # interleaved rounds, best of each host: robust to other load on this machine
        for h in plan.hosts:
            runs[h.name].append(measure.cpu_time(cluster, h.name, SPIN_ITERATIONS))
    one_core = next((h.name for h in plan.hosts if h.cpu == 1.0), None)
    best = {name: min(r, key=lambda x: x["seconds"]) for name, r in runs.items()}
    cpus = []
    for h in plan.hosts:
        wall, cpu_s = best[h.name]["seconds"], best[h.name]["cpu_seconds"]
        cpus.append({"host": h.name, "cpu": h.cpu, "spec_slowdown": 1 / min(h.cpu, 1.0),
                     "slowdown_vs_local": wall / reference,
                     "slowdown_vs_1core_host": wall / best[one_core]["seconds"] if one_core else None,
                     "effective_cores": cpu_s / wall, "seconds": wall})
    smallest = min(plan.hosts, key=lambda h: h.memory_bytes)
    before = _oom_kills(state_root, plan.spec.name, smallest.name)
    hog = measure.allocate(cluster, smallest.name, 2 * smallest.memory_bytes)
    after = _oom_kills(state_root, plan.spec.name, smallest.name)
    oom = {"host": smallest.name, "limit_bytes": smallest.memory_bytes, "asked_bytes": 2 * smallest.memory_bytes,
           "allocated_before_kill_bytes": hog["allocated_bytes"], "killed": hog["killed"],
           "oom_kills_reported": after - before}
    return {"reference_spin_seconds": reference, "rates": rates, "rtts": rtts, "cpu": cpus, "oom": oom}


def _oom_kills(state_root: Path, lab: str, host: str) -> int:
    [report] = manager.status(state_root, lab)
    return next(h["oom_kills"] for h in report["hosts"] if h["name"] == host) or 0


def render(result: dict, spec_source: str) -> str:
    lines = [f"lab_check on {spec_source}", "", "egress rate (one TCP stream, goodput at the receiver)",
             f"  {'pair':<16} {'spec Mbit/s':>12} {'measured':>10} {'ratio':>7}"]
    for r in result["rates"]:
        lines.append(f"  {r['src'] + '->' + r['dst']:<16} {r['spec_mbit']:>12.1f} {r['measured_mbit']:>10.1f} {r['ratio']:>7.3f}")
    lines += ["", "round trip (median of 30 one-byte TCP round trips)", f"  {'pair':<16} {'spec ms':>8} {'median':>8} {'min':>8}"]
    for r in result["rtts"]:
        lines.append(f"  {r['a'] + '<->' + r['b']:<16} {r['spec_ms']:>8.2f} {r['median_ms']:>8.2f} {r['min_ms']:>8.2f}")
    lines += ["", f"cpu (fixed pure-Python loop, best of 2; unconstrained on this machine: {result['reference_spin_seconds']:.3f} s)",
              f"  {'host':<16} {'cpu':>6} {'spec slowdown':>14} {'vs 1-core host':>15} {'vs local':>9} {'cpu s / wall s':>15}"]
    for c in result["cpu"]:
        vs_host = "-" if c["slowdown_vs_1core_host"] is None else f"{c['slowdown_vs_1core_host']:.2f}"
        lines.append(f"  {c['host']:<16} {c['cpu']:>6.3f} {c['spec_slowdown']:>14.2f} {vs_host:>15} "
                     f"{c['slowdown_vs_local']:>9.2f} {c['effective_cores']:>15.3f}")
    o = result["oom"]
    lines += ["", f"memory: {o['host']} (limit {o['limit_bytes'] / 1e6:.0f} MB) asked for {o['asked_bytes'] / 1e6:.0f} MB: "
              f"{'killed' if o['killed'] else 'NOT killed'} after {o['allocated_before_kill_bytes'] / 1e6:.0f} MB; "
              f"lab status oom_kills +{o['oom_kills_reported']}"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, help="lab spec (default: the built-in one)")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each rate measurement")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lab-check-") as tmp:
        spec_path = args.spec or Path(tmp, "lab.yaml")
        if args.spec is None:
            spec_path.write_text(DEFAULT_SPEC.replace("{subnet}", free_subnet(first=200)))
        spec = load(spec_path, LabSpec)
        state_root, cluster_file = Path(tmp, "state"), Path(tmp, "cluster.yaml")
        manager.up(spec, str(spec_path), state_root, cluster_file)
        try:
            plan = plan_lab(spec, __import__("os").cpu_count() or 1)
            result = check(plan, load(cluster_file, ClusterSpec), state_root, args.seconds)
        finally:
            manager.down(state_root, spec.name)
    print(json.dumps(result, indent=2) if args.json else render(result, str(args.spec or "the built-in spec")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
