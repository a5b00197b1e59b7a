"""Galaxy against Megatron-LM, sequence parallelism and local inference on the edge lab, side by side.

    python bench/galaxy_latency.py                          # lab up (needs root), profile, plan, run, lab down
    python bench/galaxy_latency.py --cluster C.yaml         # a lab that is already up (hosts l0 m0 s0 m1 m2)
    python bench/galaxy_latency.py --layers 2 --repeats 3 --rounds 2 --json
    python bench/galaxy_latency.py --rounds 6 --order alternate      # each strategy first and last equally often

The lab: five hosts at 125 Mbit/s; `l0`, `m0`, `s0` get CPU quotas in the ratio of the paper's Nano-L :
Nano-M : Nano-S CPU clocks (1.47 : 0.825 : 0.403 GHz), `m1`, `m2` are two more Nano-M. `--fastest-cpu`
(default 0.15 core) sets the scale: a core of this machine does ~50-70 GFLOP/s in fp32 GEMMs, so Nano-L
gets ~10 GFLOP/s and Nano-M ~6, near the paper's Nano-M (BERT-L, 24 layers at 30 tokens in 2.43 s:
~7.5 GFLOP/s). The paper's models are fp16, so its links carry fp16 activations: `--wire-dtype float16`
(the default here) sends the same bytes over the 125 Mbit/s links while the GEMMs run in fp32; with
both, computation and communication keep the paper's balance.
Environments: F = l0 + m0 + s0 (heterogeneous, the paper's Fig. 9) and B = m0 + m1 + m2 (homogeneous,
Table IV). Models: BERT-large and GPT2-large at sequence length 284 (the QNLI average).

Socket buffers: the lab hosts' kernels get 1 MB default TCP buffers (`--socket-buffer`, sysctl in each
host's namespace) so that a whole ring tile (at most 95 x 1280 x 4 bytes) crosses a link inside the
kernel. A lab host is a fraction of a core enforced by a CFS quota: while its process computes, every
thread of it is throttled, including gloo's network thread, so with the default 128 KB receive buffer a
tile arriving during an overlapped GEMM waits for the next quota period. A real device (a Jetson Nano
has four cores) has a core to spare for that thread.

For every model the hosts are profiled once (`inference-blocks` probe over SSH, in each host's cgroup).
Plans are made for the WHOLE model (24 / 36 layers) with the paper's memory budgets (F: 1.5 / 1.2 /
0.7 GB, B: 1.5 GB each) and fp16 weights, as in the paper, so the memory-blind baselines hit OOM where
the paper's did and are reported so, not run. Each feasible plan then runs a stack of its first
`--layers` layers (random weights, fp32) over SSH with `hppctl run`'s runtime, `--repeats` timed passes
after one warm-up, and galaxy once more with `--no-overlap`. With `--rounds N` the strategies alternate N
times. A pass's latency is its slowest device's; each strategy reports its fastest pass (other work on
this machine only ever slows a pass down; the median is printed next to it). Every strategy's output is
compared with galaxy's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hppctl.errors import Infeasible  # noqa: E402
from hppctl.lab.network import free_subnet  # noqa: E402
from hppctl.models.cluster import ClusterSpec  # noqa: E402
from hppctl.models.inference import InferenceProfile  # noqa: E402
from hppctl.planner.galaxy import make_inference_plan  # noqa: E402
from hppctl.profiling.inference import block_bytes, inference_profile, model_shapes  # noqa: E402
from hppctl.runtime.galaxy.calibrate import calibrate_comm_cpu  # noqa: E402
from hppctl.store import load, save  # noqa: E402

GB = 10**9
NANO_GHZ = {"l": 1.47, "m": 0.825, "s": 0.403}
HOSTS = {"l0": "l", "m0": "m", "s0": "s", "m1": "m", "m2": "m"}
ENVS = {
    "F (Nano-L + Nano-M + Nano-S)": {"l0": 1.5 * GB, "m0": 1.2 * GB, "s0": 0.7 * GB},
    "B (3 x Nano-M)": {"m0": 1.5 * GB, "m1": 1.5 * GB, "m2": 1.5 * GB},
}
STRATEGIES = ("galaxy", "megatron", "sp", "local")


def lab_spec(fastest: float, subnet: str, name: str = "galaxy-bench") -> str:
    hosts = "\n".join(f"  - {{name: {h}, cpu: {fastest * NANO_GHZ[k] / NANO_GHZ['l']:.3f}, memory: 3GB}}"
                      for h, k in HOSTS.items())
    return f"name: {name}\nbandwidth: 125mbit\nsubnet: {subnet}\nhosts:\n{hosts}\n"


def enlarge_socket_buffers(names, nbytes: int, lab: str = "galaxy-bench") -> None:
    """Default TCP buffers of `nbytes` in every lab host's namespace (module docstring: why)."""
    for host in names:
        subprocess.run(["ip", "netns", "exec", f"hppctl-lab-{lab}-{host}", "sysctl", "-q", "-w",
                        f"net.ipv4.tcp_rmem=4096 {nbytes} 33554432", f"net.ipv4.tcp_wmem=4096 {nbytes} 4194304"],
                       check=True)


def wait_for_quiet(limit: float, max_wait: float) -> float:
    """The lab's quotas are caps that hold only while this machine has cores to give."""
    deadline = time.monotonic() + max_wait
    while os.getloadavg()[0] > limit and time.monotonic() < deadline:
        time.sleep(10)
    return os.getloadavg()[0]


def env_profile(profile: InferenceProfile, budgets: dict[str, float], dtype_bytes: int = 2) -> InferenceProfile:
    """The measured profile restricted to an environment's hosts, with the paper's budgets, the whole
    model's layer count and fp16 weight bytes (the paper's memory accounting)."""
    shapes = model_shapes(profile.model)
    att, mlp = block_bytes(shapes, dtype_bytes)
    devices = [d.model_copy(update={"memory_bytes": int(budgets[d.name])}) for d in profile.devices if d.name in budgets]
    return InferenceProfile.model_validate({
        **profile.model_dump(), "devices": [d.model_dump() for d in devices], "num_layers": shapes.layers,
        "dtype_bytes": dtype_bytes, "attention_bytes": att, "mlp_bytes": mlp,
        "embedding_bytes": shapes.embedding_params * dtype_bytes,
        "links": [l.model_dump() for l in profile.links if set(l.between) <= set(budgets)]})


def sub_cluster(cluster: ClusterSpec, names) -> ClusterSpec:
    return cluster.model_copy(update={"devices": [d for d in cluster.devices if d.name in names],
                                      "links": [l for l in cluster.links if set(l.between) <= set(names)]})


def run_plan(plan, cluster, layers: int, repeats: int, overlap: bool, timeout: float, wire_dtype: str):
    from hppctl.runtime.galaxy.launch import InferenceRequest, run_inference

    stack = plan.model_copy(update={"num_layers": layers})
    return run_inference(InferenceRequest(stack, cluster, None, overlap=overlap, repeats=repeats, warmup=1,
                                          timeout_s=timeout, wire_dtype=wire_dtype))


def measure_env(env: str, budgets, profile, cluster, a, report) -> None:
    import torch

    prof = env_profile(profile, budgets)
    sub = sub_cluster(cluster, budgets)
    cases: dict[str, tuple] = {}
    for strategy in a.strategies.split(","):
        try:
            plan = make_inference_plan(prof, strategy, a.seq_len)
        except Infeasible as e:
            report[strategy] = {"status": "OOM (no plan)", "reason": str(e)}
            continue
        if plan.memory_violations:
            report[strategy] = {"status": "OOM", "violations": [v.model_dump() for v in plan.memory_violations]}
            continue
        cases[strategy] = (plan, True)
        if strategy == "galaxy" and len(plan.shares) > 1:
            cases["galaxy --no-overlap"] = (plan, False)
            report["galaxy predictions"] = galaxy_predictions(prof, plan, a.seq_len, a.layers)
    outputs = {}
    for r in range(a.rounds):
        names = list(cases)
        if a.order == "alternate" and r % 2:
            names.reverse()  # each strategy runs first and last equally often: no place in the round favours one
        for name in names:
            plan, overlap = cases[name]
            load_before = wait_for_quiet(a.quiet_load, a.max_wait)
            result = run_plan(plan, sub, a.layers, a.repeats, overlap, a.timeout, a.wire_dtype)
            s = result.summary()
            entry = report.setdefault(name, {"status": "ran", "rounds": []})
            entry["rounds"].append({"median_s": s["latency_s"]["median"], "min_s": s["latency_s"]["min"],
                                    "all_s": s["latency_s"]["all"],
                                    "load_before": load_before, "devices": s["devices"]})
            entry["shares"] = s["shares"]
            entry["predicted_s"] = plan.prediction.latency_s * a.layers / plan.num_layers
            entry["execution"] = {"collective": s["collective"], "block_overlap": s["block_overlap"]}
            outputs[name] = result.output
            print(f"  {env} {name} round {r}: min {s['latency_s']['min']:.3f} s, median {s['latency_s']['median']:.3f} s "
                  f"(load {load_before:.1f})",
                  file=sys.stderr)
    for name, entry in report.items():
        if entry.get("status") == "ran":
            entry["latency_s"] = min(x["min_s"] for x in entry["rounds"])
            entry["median_s"] = min(x["median_s"] for x in entry["rounds"])
            entry["median_all_s"] = statistics.median(t for x in entry["rounds"] for t in x["all_s"])
            if "galaxy" in outputs and name in outputs:
                entry["max_abs_diff_vs_galaxy"] = float((outputs[name] - outputs["galaxy"]).abs().max())
    del torch


def galaxy_predictions(profile, plan, seq_len: int, layers: int) -> dict:
    """The planner's predicted seconds for `layers` layers of the galaxy plan's split run every way it
    can: all rings overlapped, all plain, gloo's AllReduce; and what it chose."""
    from hppctl.planner.inference_costs import InferenceCosts, Layout, allreduce_latency, galaxy_ring_latency

    costs = InferenceCosts(profile, seq_len)
    layout = Layout(tuple(range(len(plan.shares))), tuple(s.heads for s in plan.shares),
                    tuple(s.columns for s in plan.shares), tuple(s.rows for s in plan.shares))
    return {"status": "prediction", "overlap_s": layers * galaxy_ring_latency(costs, layout, (True,) * 4).total_s,
            "plain_s": layers * galaxy_ring_latency(costs, layout, (False,) * 4).total_s,
            "all_reduce_s": layers * allreduce_latency(costs, layout).total_s,
            "chosen": {"collective": plan.collective, "block_overlap": list(plan.overlap_by_block())}}


def speedups(report: dict) -> dict:
    g = report.get("galaxy", {}).get("latency_s")
    out = {}
    for name, entry in report.items():
        if name != "galaxy" and g:
            out[name] = entry["latency_s"] / g if "latency_s" in entry else entry["status"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cluster", type=Path, help="a lab already up with hosts l0 m0 s0 m1 m2")
    p.add_argument("--models", default="bert-large,gpt2-large")
    p.add_argument("--seq-len", type=int, default=284)
    p.add_argument("--layers", type=int, default=2, help="layers of the stack that runs")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--order", default="fixed", choices=("fixed", "alternate"),
                   help="alternate: every other round runs the strategies in reverse order")
    p.add_argument("--fastest-cpu", type=float, default=0.15)
    p.add_argument("--wire-dtype", default="float16", choices=("float16", "float32"))
    p.add_argument("--socket-buffer", type=int, default=2**20,
                   help="default TCP buffer bytes on the lab hosts (0: the kernel's default)")
    p.add_argument("--profile-repeats", type=int, default=3)
    p.add_argument("--quiet-load", type=float, default=2.5)
    p.add_argument("--max-wait", type=float, default=300.0)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--strategies", default=",".join(STRATEGIES),
                   help="strategies to run (galaxy also runs with --no-overlap)")
    p.add_argument("--envs", default="F,B", help="environments to run (F, B)")
    p.add_argument("--lab-name", default="galaxy-bench", help="the lab's name (namespaces, cgroups)")
    p.add_argument("--subnet", help="the lab's subnet (default: a free 10.N.0.0/24 from N = 220)")
    p.add_argument("--device-python", help="interpreter the hosts run workers and probes with (e.g. a wrapper "
                                           "that puts a work tree first on PYTHONPATH)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="galaxy-latency-"))
    state = work / "state"
    cluster_file = a.cluster
    if cluster_file is None:
        (work / "lab.yaml").write_text(lab_spec(a.fastest_cpu, a.subnet or free_subnet(first=220), a.lab_name))
        cluster_file = work / "cluster.yaml"
        subprocess.run([sys.executable, "-m", "hppctl", "lab", "up", "--spec", str(work / "lab.yaml"), "--out",
                        str(cluster_file), "--state-dir", str(state)], check=True)
        if a.socket_buffer:
            enlarge_socket_buffers(HOSTS, a.socket_buffer, a.lab_name)
    report: dict = {"seq_len": a.seq_len, "layers": a.layers, "repeats": a.repeats, "rounds": a.rounds,
                    "fastest_cpu": a.fastest_cpu, "wire_dtype": a.wire_dtype, "socket_buffer": a.socket_buffer, "models": {}}
    started = time.perf_counter()
    try:
        cluster = load(cluster_file, ClusterSpec)
        if a.device_python:
            cluster = cluster.model_copy(update={"devices": [d.model_copy(update={"python": a.device_python})
                                                             for d in cluster.devices]})
        for model in a.models.split(","):
            wait_for_quiet(a.quiet_load, a.max_wait)
            t0 = time.perf_counter()
            profile = inference_profile(cluster, model, [a.seq_len], layers=a.layers, repeats=a.profile_repeats,
                                        warmup=1, timeout_s=a.timeout)
            profile = calibrate_comm_cpu(profile, cluster, seq_len=a.seq_len, wire_dtype=a.wire_dtype,
                                         timeout_s=a.timeout)
            save(work / f"{model}.json", profile)
            entry = report["models"][model] = {"profile_s": time.perf_counter() - t0, "profile": str(work / f"{model}.json"),
                                               "capacity": {}, "envs": {}}
            entry["comm_cpu_ns_per_byte"] = {}
            for d in profile.devices:
                t = d.timings[0]
                entry["capacity"][d.name] = 1 / (t.attention.seconds[-1] + t.mlp.seconds[-1])
                entry["comm_cpu_ns_per_byte"][d.name] = {
                    "cores": d.cpu_cores, "ring": (d.comm_cpu_s_per_byte or 0) * 1e9,
                    "allreduce": (d.allreduce_cpu_s_per_byte or 0) * 1e9}
            for env, budgets in ENVS.items():
                if env[0] not in a.envs.split(","):
                    continue
                env_report = entry["envs"][env] = {}
                measure_env(env, budgets, profile, cluster, a, env_report)
                env_report["speedup_of_galaxy"] = speedups(env_report)
    finally:
        if a.cluster is None:
            subprocess.run([sys.executable, "-m", "hppctl", "lab", "down", "--name", a.lab_name,
                            "--state-dir", str(state)])
    report["wall_s"] = time.perf_counter() - started
    (work / "report.json").write_text(json.dumps(report, indent=2, default=str))
    if a.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        render(report)
    print(f"report: {work / 'report.json'}", file=sys.stderr)
    return 0


def render(report: dict) -> None:
    print(f"sequence length {report['seq_len']}, {report['layers']}-layer stacks, {report['repeats']} passes, "
          f"best of {report['rounds']} round(s); fastest host {report['fastest_cpu']} core; {report['wire_dtype']} on the wire")
    for model, m in report["models"].items():
        caps = ", ".join(f"{d} {v:.2f}" for d, v in m["capacity"].items())
        print(f"\n{model}: profiled in {m['profile_s']:.0f} s; V_d (1/s): {caps}")
        comm = ", ".join(f"{d} {v['cores']:.3f} core ring {v['ring']:.2f} / all-reduce {v['allreduce']:.2f}"
                         for d, v in m.get("comm_cpu_ns_per_byte", {}).items() if v["cores"])
        if comm:
            print(f"  CPU ns per byte sent + received: {comm}")
        for env, r in m["envs"].items():
            print(f"  {env}")
            pred = r.get("galaxy predictions")
            if pred:
                print(f"    galaxy predicted: overlap {pred['overlap_s']:.3f} s, plain {pred['plain_s']:.3f} s, "
                      f"all-reduce {pred['all_reduce_s']:.3f} s; chose {pred['chosen']}")
            for name in ("galaxy", "galaxy --no-overlap", *STRATEGIES[1:]):
                e = r.get(name)
                if e is None:
                    continue
                if "latency_s" in e:
                    shares = " ".join(f"{s['device']}:{s['heads']}h/{s['columns']}c/{s['rows']}r" for s in e["shares"])
                    gain = r["speedup_of_galaxy"].get(name)
                    ex = e.get("execution", {})
                    how = ("all-reduce" if ex.get("collective") == "all-reduce"
                           else "overlap " + "".join("1" if f else "0" for f in ex.get("block_overlap", [])))
                    print(f"    {name:22s} {e['latency_s']:.3f} s (median {e['median_s']:.3f}, predicted {e['predicted_s']:.3f}) [{how}]"
                          f"{f'  galaxy {gain:.2f}x faster' if isinstance(gain, float) else ''}  [{shares}]"
                          f"  diff {e.get('max_abs_diff_vs_galaxy', 0):.1e}")
                else:
                    print(f"    {name:22s} {e['status']}")
            print_round_ratios(r)


def round_ratios(env_report: dict, name: str) -> dict | None:
    """`name` against galaxy within each round (name's time / galaxy's: above 1, galaxy faster), by
    fastest pass and by median pass, and both medians of every timed pass of all rounds."""
    g, o = env_report.get("galaxy", {}), env_report.get(name, {})
    if "rounds" not in g or "rounds" not in o:
        return None
    pairs = list(zip(g["rounds"], o["rounds"]))
    return {"fastest": [y["min_s"] / x["min_s"] for x, y in pairs],
            "median": [y["median_s"] / x["median_s"] for x, y in pairs],
            "pooled_median_s": (g["median_all_s"], o["median_all_s"])}


def print_round_ratios(env_report: dict) -> None:
    for name in ("galaxy --no-overlap", *STRATEGIES[1:]):
        r = round_ratios(env_report, name)
        if r is None:
            continue
        fastest, median = (" ".join(f"{x:.2f}" for x in r[k]) for k in ("fastest", "median"))
        print(f"    {name} / galaxy per round: fastest pass [{fastest}], median pass [{median}]; median of every "
              f"pass: galaxy {r['pooled_median_s'][0]:.3f} s, {name} {r['pooled_median_s'][1]:.3f} s "
              f"({r['pooled_median_s'][1] / r['pooled_median_s'][0]:.2f}x)")


if __name__ == "__main__":
    sys.exit(main())
