"""Bi-Partition against layer-wise partitioning, trained for real on the edge lab, side by side.

    sudo python bench/bipartition.py                          # homogeneous lab: 3 hosts x 0.5 core, 100 Mbit/s
    sudo python bench/bipartition.py --hetero                 # heterogeneous lab: NX, TX2, Nano presets
    sudo python bench/bipartition.py --hetero --bandwidth 1000mbit
    python bench/bipartition.py --cluster C.yaml --profile P.json   # a lab that is up and its profile

The paper (Cui et al. 2023) ran identical 1-core VMs at 100 Mbit/s and reports up to 1.9x over
PipeDream (layer-wise cuts + 1F1B) for VGG16/AlexNet/LeNet-5 on CIFAR-10/MNIST. Here: `vgg-mini` (a
VGG-style CNN, zoo) on scikit-learn's digits resized to 32x32, the lab's hosts as devices (this
machine has 2 cores, so a homogeneous host gets `--cpu` of a core, default 0.5), and for every
strategy the same request is planned on the *measured* profile, replayed by the simulator, then
trained with `hppctl run`'s runtime over SSH (one worker per host, in its netns and cgroup).

Strategies: `bipartition` (separate forward/backward cuts), `layerwise` (the same DP and cost model
with equal cuts: the paper's layer-wise baseline) and `pp` (hppctl's layer-wise planner, GPipe's
compute-balanced cuts, ignoring transfer sizes). Measured throughput is the median samples/s over
the rounds after `--warmup` (bench/hpp_vs_baselines.py's `run_strategy`); with `--repeat N` the
strategies alternate and each reports its least disturbed run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from hpp_vs_baselines import HPPCTL, run_strategy, sh  # noqa: E402

from hppctl.lab.network import free_subnet  # noqa: E402
from hppctl.models.cluster import ClusterSpec  # noqa: E402
from hppctl.models.profile import Profile  # noqa: E402
from hppctl.store import load  # noqa: E402

HOMOGENEOUS = """name: {name}
bandwidth: {bandwidth}
subnet: {subnet}
hosts:
{hosts}"""
HETEROGENEOUS = """name: {name}
bandwidth: {bandwidth}
subnet: {subnet}
fastest_cpu: {cpu}
hosts:
  - {{name: nx0, preset: jetson-nx}}
  - {{name: tx0, preset: jetson-tx2}}
  - {{name: nano0, preset: jetson-nano}}
"""


def lab_spec(args) -> str:
    subnet = free_subnet(first=230)
    if args.hetero:
        return HETEROGENEOUS.format(name=args.lab_name, subnet=subnet, cpu=args.cpu, bandwidth=args.bandwidth)
    hosts = "".join(f"  - {{name: vm{i}, cpu: {args.cpu}, memory: 1GB}}\n" for i in range(args.hosts))
    return HOMOGENEOUS.format(name=args.lab_name, subnet=subnet, hosts=hosts, bandwidth=args.bandwidth)


def lab_and_profile(args, work: Path) -> tuple[Path, Path, bool]:
    started = False
    cluster = Path(args.cluster) if args.cluster else None
    if cluster is None:
        spec = work / "lab.yaml"
        spec.write_text(lab_spec(args))
        cluster = work / "cluster.yaml"
        sh(*HPPCTL, "lab", "up", "--spec", spec, "--out", cluster)
        started = True
    profile = Path(args.profile) if args.profile else work / "profile.json"
    if not args.profile:
        began = time.perf_counter()
        sh(*HPPCTL, "profile", "--cluster", cluster, "--model", args.model, "--granularity", args.granularity,
           "--batch-sizes", args.batch_sizes, "--out", profile)
        print(f"profiled in {time.perf_counter() - began:.0f} s -> {profile}", flush=True)
    return cluster, profile, started


def describe(stages: list[dict], plan_stages) -> str:
    parts = []
    for s in plan_stages:
        back = s.backward
        ranges = f"F[{s.start},{s.end}) B[{back[0]},{back[1]})" if tuple(s.layers) != back else f"[{s.start},{s.end})"
        parts.append(f"{s.devices[0]}:{ranges}")
    return " ".join(parts)


def report(results: list[dict]) -> None:
    print()
    print(f"{'strategy':<12} {'estimate':>9} {'simulated':>10} {'measured':>9}   samples/s   plan")
    for r in results:
        print(f"{r['strategy']:<12} {r['estimate_samples_per_s']:9.1f} {r['simulated_samples_per_s']:10.1f} "
              f"{r['measured_samples_per_s']:9.1f}   {r['ranges']}")
    by = {r["strategy"]: r for r in results}
    if "bipartition" in by:
        for base in [r for r in results if r["strategy"] != "bipartition"]:
            ratio = lambda key: by["bipartition"][key] / base[key]  # noqa: E731
            print(f"bipartition / {base['strategy']}: measured {ratio('measured_samples_per_s'):.2f}x, simulated "
                  f"{ratio('simulated_samples_per_s'):.2f}x, estimate {ratio('estimate_samples_per_s'):.2f}x "
                  f"(paper: up to 1.9x over PipeDream on identical 1-core VMs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", help="cluster file of a lab that is up (default: bring one up)")
    parser.add_argument("--profile", help="measured profile of that cluster (default: hppctl profile)")
    parser.add_argument("--hetero", action="store_true", help="heterogeneous lab (NX, TX2, Nano presets)")
    parser.add_argument("--hosts", type=int, default=3, help="homogeneous lab: number of hosts")
    parser.add_argument("--cpu", type=float, default=0.5, help="cores per homogeneous host / of the fastest preset")
    parser.add_argument("--bandwidth", default="100mbit", help="every link of a lab this script brings up")
    parser.add_argument("--model", default="vgg-mini")
    parser.add_argument("--granularity", default="fine")
    parser.add_argument("--batch-sizes", default="4,8,16,32")
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--strategies", default="bipartition,layerwise,pp")
    parser.add_argument("--lab-name", default="bipart")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--keep", action="store_true", help="leave a lab this script brought up")
    parser.add_argument("--out", help="write every figure as JSON")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bipartition-bench-"))
    cluster_file, profile_file, started = lab_and_profile(args, work)
    try:
        from hppctl.models.plan import PlanRequest
        from hppctl.planner import make_plan

        cluster, profile = load(cluster_file, ClusterSpec), load(profile_file, Profile)
        print(f"{args.model} on {cluster.name} ({len(cluster.devices)} hosts): global batch {args.global_batch}, "
              f"micro-batch {args.micro_batch}, {args.rounds} rounds; machine: {os.cpu_count()} cores, load average "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        runs: dict[str, list[dict]] = {name: [] for name in args.strategies.split(",")}
        for i in range(args.repeat):
            for name in runs:
                print(f"running {name} ({i + 1}/{args.repeat}) …", flush=True)
                r = run_strategy(name, profile, cluster, args)
                plan = make_plan(profile, PlanRequest(global_batch=args.global_batch, micro_batch=args.micro_batch), name)
                r["ranges"] = describe(r["stages"], plan.stages)
                runs[name].append(r)
                print(f"  {r['ranges']}: measured {r['measured_samples_per_s']:.1f} samples/s, simulated "
                      f"{r['simulated_samples_per_s']:.1f}, wall {r['wall_s']:.0f} s, load "
                      f"{r['load_average_before']:.1f} -> {r['load_average_after']:.1f}", flush=True)
        results = [max(rs, key=lambda r: r["measured_samples_per_s"]) for rs in runs.values()]
        report(results)
        if args.out:
            Path(args.out).write_text(json.dumps({"args": vars(args), "results": results, "runs": runs}, indent=2) + "\n")
    finally:
        if started and not args.keep:
            sh(*HPPCTL, "lab", "down", "--name", args.lab_name)


if __name__ == "__main__":
    main()
