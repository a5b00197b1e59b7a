"""Parallel split learning on the edge lab: 4 clients and 2 helpers, profile → psl plan → measured run.

    sudo python bench/psl_lab.py                       # lab up, profile, plan, run, lab down (~10 min)
    python bench/psl_lab.py --cluster lab.yaml --profile prof.json    # an existing lab and profile
    python bench/psl_lab.py --method balanced-greedy --rounds 4 --local-batches 4 --orders plan --keep

Issue 11's acceptance: the batch makespan measured on a lab of 4 clients and 2 helpers is within
20 % of the plan's prediction. Every step is the CLI a user would type (printed as it runs):
`hppctl lab up` (hosts with CPU quotas and memory limits, 100 Mbit/s links, the subnet from
`free_subnet()`), `hppctl profile` (each host measured over SSH in its own cgroup), `hppctl psl
plan --profile` (the six per-pair times from that profile), and `hppctl psl run` (one worker per
host over SSH; every batch starts after a barrier, so a client's c_j and the batch makespan max_j c_j
are measured as the plan predicts them). Measured = the median batch makespan over the batches after
the first (which pays one-off allocations). Per client: planned c_j against the median measured.
The run is repeated with `--order ltf` (helpers pick online, largest remaining client tail first)
on the same lab and plan.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hppctl.lab.network import free_subnet  # noqa: E402

HPPCTL = [sys.executable, "-m", "hppctl"]
LAB = """name: {name}
bandwidth: 100mbit
subnet: {subnet}
hosts:
  - {{name: c0, cpu: 0.1, memory: 1GB}}
  - {{name: c1, cpu: 0.1, memory: 1GB}}
  - {{name: c2, cpu: 0.2, memory: 1GB}}
  - {{name: c3, cpu: 0.2, memory: 1GB}}
  - {{name: h0, cpu: 0.5, memory: 2GB}}
  - {{name: h1, cpu: 0.3, memory: 2GB}}
"""
CLIENTS, HELPERS = "c0,c1,c2,c3", "h0,h1"


def hppctl(*args: str, capture: bool = False) -> str:
    command = [*HPPCTL, *map(str, args)]
    print("$ hppctl " + " ".join(map(str, args)), flush=True)
    done = subprocess.run(command, cwd=ROOT, text=True, stdout=subprocess.PIPE if capture else None)
    if done.returncode != 0:
        raise SystemExit(f"hppctl {args[0]} failed with exit {done.returncode}")
    return done.stdout or ""


def profile_and_plan(a, work: Path, cluster: Path) -> Path:
    profile = Path(a.profile) if a.profile else work / "profile.json"
    if not a.profile:
        hppctl("profile", "--cluster", cluster, "--model", a.model, "--granularity", "block",
               "--batch-sizes", a.batch, "--out", profile)
    plan = work / "plan.yaml"
    hppctl("psl", "plan", "--profile", profile, "--clients", CLIENTS, "--helpers", HELPERS, "--cut", a.cut,
           "--batch", a.batch, "--method", a.method, "--out", plan)
    return plan


def measure(a, plan: Path, cluster: Path, metrics: Path, order: str) -> dict:
    out = hppctl("psl", "run", "--plan", plan, "--cluster", cluster, "--order", order, "--rounds", a.rounds,
                 "--local-batches", a.local_batches, "--dataset", "synthetic", "--optimizer", "adam", "--lr", "0.001",
                 "--metrics", metrics, "--json", capture=True)
    return json.loads(out)


def steps(plan_file: Path, metrics: Path, profile_file: Path) -> None:
    """Per client, each step of the chain as planned and as measured (medians after the first batch).

    A client sees when a download *ends*, not when it starts, so the measured l + l′ runs from the
    arrival of the σ2 activations (without their download) and r′ from the arrival of the σ1
    gradients; the planned columns leave the same downloads out (B·a(σ)/bw from the profile). The
    downloads, the helper's p and p′ and its queueing make up "rest" = c_j minus the three."""
    import statistics

    from hppctl.models.profile import Profile
    from hppctl.models.psl import PslPlan
    from hppctl.planner.cost import CostModel
    from hppctl.store import load

    plan = load(plan_file, PslPlan)
    cost = CostModel(load(profile_file, Profile), micro_batch=plan.batch, num_micro_batches=1)
    index = {name: k for k, name in enumerate(cost.names)}
    t, helper = plan.times, {h: i for i, h in enumerate(plan.helpers)}
    batches = [b for line in metrics.read_text().splitlines() for b in json.loads(line)["batches"]][1:]
    print("\nclient   r plan/run ms   l+l' plan/run   r' plan/run   rest plan/run   (l+l', r' without downloads)")
    for j, c in enumerate(plan.clients):
        i, (s1, s2) = helper[plan.assignment[j]], plan.cuts[j]
        bw = cost.bw[index[c]][index[plan.assignment[j]]]
        down1, down2 = plan.batch * cost.boundary[s1 - 1] / bw, plan.batch * cost.boundary[s2 - 1] / bw
        med = {k: statistics.median(b["clients"][c][k] for b in batches)
               for k in ("sent_s", "activations_s", "gradients_sent_s", "gradients_s", "completion_s")}
        run = [med["sent_s"], med["gradients_sent_s"] - med["activations_s"], med["completion_s"] - med["gradients_s"]]
        planned = [t.r_s[i][j], t.l_s[i][j] + t.l_prime_s[i][j] - down2, t.r_prime_s[i][j] - down1]
        completion = next(p.completion_s for p in plan.prediction.clients if p.client == c)
        run.append(med["completion_s"] - sum(run))
        planned.append(completion - sum(planned))
        print(f"{c:8} " + "  ".join(f"{p * 1e3:7.0f}/{m * 1e3:<6.0f}" for p, m in zip(planned, run)))
    column = {c: j for j, c in enumerate(plan.clients)}
    print("helper tasks: planned p or p' / measured median ms (median start after the barrier)")
    for h in plan.helpers:
        runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for b in batches:
            for kind, client, start, end, *_ in b["helpers"][h]:
                runs.setdefault((kind, client), []).append((start, end - start))
        cells = []
        for (kind, client), seen in sorted(runs.items(), key=lambda kv: statistics.median(s for s, _ in kv[1])):
            planned = (t.p_s if kind == "F" else t.p_prime_s)[helper[h]][column[client]]
            took, start = statistics.median(d for _, d in seen), statistics.median(s for s, _ in seen)
            cells.append(f"{kind}:{client} {planned * 1e3:.0f}/{took * 1e3:.0f} ({start * 1e3:.0f})")
        print(f"{h}: " + "  ".join(cells))


def report(summary: dict) -> None:
    p, span = summary["plan"], summary["batch_makespan_s"]
    print(f"\n## measured run: {p['model']}, batch {p['batch']}, {p['clients']} clients, {p['helpers']} helpers, "
          f"{p['method']} plan{' (preemptive: run without preemption)' if p['preemptive'] else ''}, "
          f"helpers' order: {summary['order']}")
    print(f"{'client':8} {'helper':8} {'planned c_j ms':>15} {'measured c_j ms':>16} {'diff':>8}")
    for c, row in summary["clients"].items():
        diff = row["median_completion_s"] / row["planned_completion_s"] - 1
        print(f"{c:8} {row['helper']:8} {row['planned_completion_s'] * 1e3:15.1f} "
              f"{row['median_completion_s'] * 1e3:16.1f} {diff:+8.1%}")
    print("batch makespans ms: " + " ".join(f"{m * 1e3:.0f}" for m in span["all"]))
    verdict = "within" if abs(summary["measured_vs_predicted"]) <= 0.20 else "NOT within"
    print(f"batch makespan: measured median {span['median'] * 1e3:.1f} ms over {summary['batches'] - 1} batches "
          f"(min {span['min'] * 1e3:.1f}, max {span['max'] * 1e3:.1f}); plan predicted "
          f"{summary['predicted_makespan_s'] * 1e3:.1f} ms -> {summary['measured_vs_predicted']:+.1%}, {verdict} 20 %")
    if p["preemptive"]:
        print(f"the plan's order without preemption replays at {summary['replayed_makespan_s'] * 1e3:.1f} ms")
    orders = "; ".join(f"{h}: " + ", ".join(f"{k} x{n}" for k, n in runs.items())
                       for h, runs in summary["helper_orders"].items())
    print(f"helpers followed the plan's order: {summary['helper_order_followed']} ({orders}); FedAvg "
          f"{summary['fedavg_s'] * 1e3:.1f} ms per round; loss {summary['loss']:.4f}")
    for d, w in summary["workers"].items():
        print(f"  {d}: host {w['host']}, cgroup {w['cgroup']}, peak RSS {w['peak_rss_bytes'] / 2**20:.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mobilenetv2")
    ap.add_argument("--cut", default="3,15", help="σ1,σ2 at block granularity")
    ap.add_argument("--batch", default="64", help="at 16, each client step is a few CFS periods long and runs "
                    "~20-40 %% faster than its sustained-rate profile (docs/psl.md)")
    ap.add_argument("--method", default="balanced-greedy")
    ap.add_argument("--rounds", default="3")
    ap.add_argument("--local-batches", default="4")
    ap.add_argument("--orders", default="plan,ltf", help="helpers' task order of each run, on the same lab and plan")
    ap.add_argument("--cluster", help="an existing lab's cluster file (skips lab up/down)")
    ap.add_argument("--profile", help="an existing profile of that cluster (skips profiling)")
    ap.add_argument("--lab-name", default="psl-bench")
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="psl-lab-"))
    print(f"# bench/psl_lab.py — {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores (shared), "
          f"load {os.getloadavg()[0]:.1f}; files in {work}", flush=True)
    state = work / "state"
    cluster = Path(a.cluster) if a.cluster else work / "cluster.yaml"
    try:
        if not a.cluster:
            (work / "lab.yaml").write_text(LAB.format(name=a.lab_name, subnet=free_subnet(first=210)))
            print((work / "lab.yaml").read_text())
            hppctl("lab", "up", "--spec", work / "lab.yaml", "--out", cluster, "--state-dir", state)
        plan = profile_and_plan(a, work, cluster)
        for order in a.orders.split(","):
            metrics = work / f"psl-metrics-{order}.jsonl"
            summary = measure(a, plan, cluster, metrics, order)
            steps(plan, metrics, Path(a.profile) if a.profile else work / "profile.json")
            report(summary)
    finally:
        if not a.cluster and not a.keep:
            hppctl("lab", "down", "--name", a.lab_name, "--state-dir", state)


if __name__ == "__main__":
    main()
