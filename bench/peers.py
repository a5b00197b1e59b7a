"""hppctl's strategies beside stock PyTorch peers, trained on the same lab hosts, side by side.

As root, from the repository root (each brings its lab up, profiles it, alternates the five
strategies 3 times and takes the lab down; ~14 min each on the project's 2-core VM):

    flock /work/notes/bench.lock python bench/peers.py --repeat 3 --out out/peers-envb.json
    flock /work/notes/bench.lock python bench/peers.py --homogeneous --repeat 3 --out out/peers-homog.json
    python bench/peers.py --cluster envb.yaml --profile envb-mobilenetv2.json   # a lab that is up, its profile
    python bench/peers.py --micro-batch auto       # hppctl's plans through hppctl.planner's auto choice

The lab hosts run the machine's installed hppctl (hppctl's workers) and this checkout's
bench/peer_worker.py (PYTHONPATH = this checkout); keep the two the same code.

The labs (bench/hpp_vs_baselines.py brings them up): Env B = 3 jetson-nx + 2 jetson-tx2 presets at
100 Mbit/s, `fastest_cpu` 0.3 (default lab `peerb28`, 10.232.0.0/24); `--homogeneous` = 3 jetson-nx
(`peerh28`, 10.233.0.0/24). mobilenetv2 at fine granularity, digits at 32x32, global batch 256, SGD
lr 0.01 (momentum 0.9, hppctl's default), one thread per process, `--rounds` 14 steps of which the
first `--warmup` 2 are left out.

Strategies (`--strategies`, in this order every cycle):
- hppctl's (`asteroid`, `dp`, `pp`, …, and `asteroid+zb`, `pp+zb`: the same with split backwards,
  `hppctl plan --split-backward`): planned on the lab's measured profile at `--micro-batch`
  (`hpp_vs_baselines.plan_for`; `auto`: each strategy's own best, ranked by the simulator), trained with hppctl's runtime (`Session(RunRequest(...)).run()`).
- stock peers (`ddp`, `pipe-1f1b`, `pipe-gpipe`; `pipe-1f1b@16` runs the pipeline on hppctl's `pp`
  plan at micro-batch 16, so a peer can be measured at several micro-batches and its best taken):
  bench/peer_worker.py on every host it needs,
  started over the lab's SSH (so in the host's netns and cgroup) with `python -m
  torch.distributed.run --nnodes N --nproc-per-node 1 --node-rank R --master-addr <first host>
  --master-port P` (static rendezvous: the agent on the first host holds the store), gloo bound to
  the lab interface (`GLOO_SOCKET_IFNAME`, `--ifname`). `ddp` uses every host of the cluster;
  the pipelines run hppctl's `pp` plan — its layer ranges, on its devices, at its micro-batch, one
  device per stage — so the torch schedules and hppctl's are compared on one split.

Throughput: hppctl's per-round samples/s; a peer's step time is the slowest rank's (each rank times
end of step to end of step), samples/s = global batch / that. Each strategy's figure is the median
over the rounds after warm-up. The strategies alternate `--repeat` times; ratios (asteroid / best
real peer, dp / ddp, every hppctl strategy / every peer) are taken within each cycle, where the
machine's other load hits all alike, and the median over cycles is reported.

Correctness, cheaply: every strategy's first-step loss (hppctl's round 0, the peers' step 0) is
checked (relative 1e-3) against a reference computed here on the same initial weights and samples,
forwarding as that strategy does (`reference_loss`): stage by stage, each rank's share of each
micro-batch a forward of its own (BatchNorm's batch), each rank's dropout masks drawn from the seed
hppctl's workers set per round and rank (the peer worker sets the same). A wrong split, wrong
samples, other weights or a stage that skips layers would show; the same loss also says the peers
train the same network as hppctl.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

import hpp_vs_baselines as hvb  # noqa: E402
from hppctl.runtime.config import dropout_seed  # noqa: E402
from hppctl.zoo import layer_costs  # noqa: E402
from peer_worker import MODES as PEERS, RESULT_PREFIX, equal_share, schedule_refusal  # noqa: E402

HOMOGENEOUS_SPEC = "".join(line for line in hvb.SPEC.splitlines(keepends=True) if "jetson-tx2" not in line)
"""Env B's lab spec without its two TX2 hosts: 3 jetson-nx."""
DEFAULT_STRATEGIES = "asteroid,dp,ddp,pipe-1f1b,pipe-gpipe"
LOSS_TOLERANCE = 1e-3
"""Relative: float32 sums in another order (and gloo's reduction) differ in the 6th-7th digit."""


def micro_batch_arg(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or auto, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer or auto, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", help="cluster file of a lab that is up (default: bring one up)")
    p.add_argument("--profile", help="measured profile of that cluster (default: hppctl profile)")
    p.add_argument("--peer-plan", help="a pp plan file the pipelines (pipe-1f1b, pipe-gpipe without @B) run "
                                       "instead of planning pp: a split from another run or profile")
    p.add_argument("--homogeneous", action="store_true", help="3 jetson-nx instead of Env B")
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--granularity", default="fine")
    p.add_argument("--batch-sizes", default="2,4,8,16,32,64,128,256",
                   help="profiled batch sizes; --micro-batch auto only considers plans within them, and dp at one "
                        "micro-batch per round gives a device up to 256 / hosts samples (docs/planner.md)")
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--micro-batch", type=micro_batch_arg, default=32, help="hppctl's plans: an integer or auto")
    p.add_argument("--trial-top", type=int, default=0,
                   help="with --micro-batch auto: hppctl's strategies keep the fastest of their best simulated "
                        "candidates, each trained --trial-rounds rounds on the lab first (hppctl plan --trial)")
    p.add_argument("--trial-rounds", type=int, default=8)
    p.add_argument("--trial-passes", type=int, default=1, help="hppctl plan --trial-passes")
    p.add_argument("--rounds", type=int, default=14)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2, help="alternation cycles")
    p.add_argument("--strategies", default=DEFAULT_STRATEGIES)
    p.add_argument("--fastest-cpu", type=float, default=0.3)
    p.add_argument("--lab-name", help="default peerb28 (Env B) or peerh28 (--homogeneous)")
    p.add_argument("--subnet", help="default 10.232.0.0/24 (Env B) or 10.233.0.0/24 (--homogeneous)")
    p.add_argument("--ifname", default="eth0", help="the hosts' lab interface, for gloo")
    p.add_argument("--master-port", type=int, default=29600, help="first port; each peer run takes the next")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds a stock peer run may take, all its ranks together; past it each rank is killed "
                        "and its output reported")
    p.add_argument("--keep", action="store_true", help="leave a lab this script brought up")
    p.add_argument("--out", help="write every figure as JSON")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.lab_name is None:
        args.lab_name = "peerh28" if args.homogeneous else "peerb28"
    if args.subnet is None:
        args.subnet = "10.233.0.0/24" if args.homogeneous else "10.232.0.0/24"
    names = [s for s in args.strategies.split(",") if s]
    if not names or len(set(names)) != len(names):
        p.error(f"--strategies: a comma-separated list without repeats, got {args.strategies!r}")
    args.strategy_list = names
    if args.warmup >= args.rounds:
        p.error(f"--warmup: {args.warmup} leaves no round of --rounds {args.rounds} to measure")
    if args.repeat < 1:
        p.error("--repeat: at least 1")
    return args


# ---- pure figures -----------------------------------------------------------------------------

def peer_step_s(ranks: list[dict]) -> list[float]:
    """Per step, the slowest rank's wall time (a step ends for the job when its last rank is done)."""
    steps = {len(r["step_s"]) for r in ranks}
    if len(steps) != 1:
        raise ValueError(f"ranks recorded different numbers of steps: {sorted(steps)}")
    return [max(r["step_s"][i] for r in ranks) for i in range(steps.pop())]


def median_samples_per_s(step_s: list[float], global_batch: int, warmup: int) -> float:
    return statistics.median(global_batch / s for s in step_s[warmup:])


def cycle_ratios(cycle: dict[str, float]) -> dict[str, float]:
    """Ratios of one cycle's samples/s: asteroid (with and without split backwards) and hppctl's fastest
    strategy over the best real peer, and every hppctl strategy over every peer that ran."""
    peers = {k: v for k, v in cycle.items() if is_peer(k)}
    ours = {k: v for k, v in cycle.items() if not is_peer(k)}
    ratios = {f"{a}/{b}": ours[a] / peers[b] for a in ours for b in peers}
    for name in ("asteroid", "asteroid+zb"):
        if name in ours and peers:
            ratios[f"{name}/best_peer"] = ours[name] / max(peers.values())
    if ours and peers:
        ratios["best_hppctl/best_peer"] = max(ours.values()) / max(peers.values())
    return ratios


def summarize(cycles: list[dict[str, float]]) -> dict:
    """Median samples/s per strategy and median of each within-cycle ratio over the cycles."""
    per_cycle = [cycle_ratios(c) for c in cycles]
    keys = list(dict.fromkeys(k for r in per_cycle for k in r))
    return {"samples_per_s": {s: statistics.median(c[s] for c in cycles if s in c) for s in cycles[0]},
            "ratios": {k: statistics.median(r[k] for r in per_cycle if k in r) for k in keys},
            "ratios_per_cycle": per_cycle,
            "best_peer_per_cycle": [max((k for k in c if is_peer(k)), key=c.get, default=None) for c in cycles]}


def table(summary: dict, cycles: list[dict[str, float]]) -> str:
    lines = [f"{'samples/s':<12} {'median':>8}   per cycle"]
    for s, v in summary["samples_per_s"].items():
        each = "  ".join(f"{c[s]:7.1f}" for c in cycles if s in c)
        lines.append(f"{s:<12} {v:8.1f}   {each}")
    lines.append("")
    lines.append(f"{'ratio (within a cycle)':<26} {'median':>7}   per cycle")
    for k, v in summary["ratios"].items():
        each = "  ".join(f"{r[k]:6.2f}" for r in summary["ratios_per_cycle"] if k in r)
        lines.append(f"{k:<26} {v:6.2f}x   {each}")
    return "\n".join(lines)


def loss_checks(first_losses: dict[str, float], references: dict[str, float]) -> list[dict]:
    """Each strategy's first-step loss against its reference (None: nothing to check it against)."""
    rows = []
    for s, loss in first_losses.items():
        ref = references.get(s)
        rel = abs(loss - ref) / abs(ref) if ref is not None else None
        rows.append({"strategy": s, "loss": loss, "reference": ref, "relative_error": rel,
                     "ok": None if ref is None else rel <= LOSS_TOLERANCE})
    return rows


# ---- plans, references, runs ------------------------------------------------------------------

Layout = list[tuple[int, int, list[tuple[int, int]]]]
"""A forward pass as a strategy runs it: per stage, its layer range and its (rank, samples) shares of
every micro-batch, in order (the ranks' dropout seeds; the shares are BatchNorm's batches)."""


def plan_layout(plan) -> Layout:
    """hppctl's plan: ranks in `HppPlan.devices()` order (runtime/topology.py)."""
    rank = {d: i for i, d in enumerate(plan.devices())}
    return [(s.layers[0], s.layers[1], [(rank[d], n) for d, n in zip(s.devices, s.samples) if n]) for s in plan.stages]


def peer_layout(mode: str, pp, layers: int, global_batch: int, world: int) -> tuple[Layout, int]:
    """A peer's layout and micro-batch: DDP one stage of every rank's equal share of one micro-batch
    (the global batch); the pipelines the pp plan's stages, one rank each, at its micro-batch."""
    if mode == "ddp":
        shares = [(r, b - a) for r, (a, b) in enumerate(equal_share(global_batch, world, r) for r in range(world))]
        return [(0, layers, shares)], global_batch
    return [(s.layers[0], s.layers[1], [(i, pp.micro_batch)]) for i, s in enumerate(pp.stages)], pp.micro_batch


def reference_loss(model: str, granularity: str, layout: Layout, micro_batch: int, global_batch: int,
                   seed: int = 0) -> float:
    """Round 0's loss (mean cross-entropy over the global batch) on the initial weights, computed
    here as `layout` computes it: each stage's module cut by the zoo, each rank's share of a
    micro-batch a separate forward (its own BatchNorm batch), each rank's dropout masks drawn from
    its own seed in micro-batch order."""
    import torch
    import torch.nn.functional as F

    from hppctl.runtime.data import SampleOrder, load_data
    from hppctl.zoo import build_stage, get_model

    torch.set_num_threads(1)
    whole = get_model(model).build(seed=seed).train()
    modules = [build_stage(whole, granularity, a, b, mode="train") for a, b, _ in layout]
    data = load_data("digits", model)
    order = SampleOrder(len(data.train), global_batch, micro_batch, seed)
    rng = {}
    for _, _, shares in layout:
        for r, _ in shares:
            torch.manual_seed(dropout_seed(seed, 0, r))
            rng[r] = torch.get_rng_state()
    total = 0.0
    with torch.no_grad():
        for m in range(global_batch // micro_batch):
            x, y = data.train.take(order.indices(0, m, 0, micro_batch))
            values = (x,)
            for module, (_, _, shares) in zip(modules, layout):
                pieces, lo = [], 0
                for r, n in shares:
                    torch.set_rng_state(rng[r])
                    pieces.append(module(*(v[lo:lo + n] for v in values)))
                    rng[r] = torch.get_rng_state()
                    lo += n
                values = tuple(torch.cat(parts) for parts in zip(*pieces))
            total += float(F.cross_entropy(values[0], y, reduction="sum"))
    return total / global_batch


def ssh_command(cluster, device, remote: str) -> list[str]:
    """ssh to a cluster host with the cluster's key and known_hosts, host keys checked; `-tt` so that
    the remote job gets a hang-up when this end goes away."""
    argv = ["ssh", "-tt", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "LogLevel=ERROR"]
    if device.port:
        argv += ["-p", str(device.port)]
    if cluster.ssh.identity_file:
        argv += ["-i", cluster.ssh.identity_file]
    if cluster.ssh.known_hosts:
        argv += ["-o", f"UserKnownHostsFile={cluster.ssh.known_hosts}"]
    return argv + [f"{device.user}@{device.host}", remote]


def is_peer(name: str) -> bool:
    return peer_mode(name)[0] in PEERS


def peer_mode(name: str) -> tuple[str, str]:
    """A peer strategy's mode and the key of the pp plan it runs: `pipe-1f1b` runs `pp` (hppctl's pp plan
    at --micro-batch), `pipe-1f1b@16` runs `pp@16` (pp planned at micro-batch 16), so the torch pipelines
    can be measured at several micro-batches and the best of them taken as the real peer."""
    mode, _, micro = name.partition("@")
    return mode, f"pp@{micro}" if micro else "pp"


def pp_at(key: str, profile, args):
    """The `pp@B` plan: pp at micro-batch B."""
    from argparse import Namespace

    return hvb.plan_for("pp", profile, Namespace(**{**vars(args), "micro_batch": int(key.partition("@")[2])}))


def peer_hosts(name: str, cluster, plans: dict) -> tuple[list[str], str | None]:
    """The devices a peer runs on, in rank order, and the pipelines' stage argument."""
    mode, pp_key = peer_mode(name)
    if mode == "ddp":
        return [d.name for d in cluster.devices], None
    pp = plans[pp_key]
    return [s.devices[0] for s in pp.stages], ",".join(f"{s.layers[0]}:{s.layers[1]}" for s in pp.stages)


def run_peer(mode: str, cluster, names: list[str], stages: str | None, micro: int, args, port: int) -> dict:
    """Start bench/peer_worker.py on hosts `names` (rank order) under torch.distributed.run; its figures.
    `stages`: the pipelines' layer ranges (`a:b,b:c`), `micro`: their micro-batch."""
    master = cluster.device(names[0]).host
    worker = [str(BENCH / "peer_worker.py"), "--mode", mode, "--model", args.model, "--granularity", args.granularity,
              "--global-batch", str(args.global_batch), "--micro-batch", str(micro), "--rounds", str(args.rounds)]
    if stages:
        worker += ["--stages", stages]
    procs = []
    # torch.distributed.run makes a torchelastic_* log folder in the temporary directory and leaves it
    # (one per host and run: 80 in /tmp after one bench); the lab's hosts share this machine's file
    # system, so a folder of the bench's own, removed below, takes them.
    scratch = tempfile.mkdtemp(prefix="hpp-peer-run-")
    load_before = os.getloadavg()[0]
    began = time.perf_counter()
    try:
        for rank, name in enumerate(names):
            device = cluster.device(name)
            remote = (f"cd {shlex.quote(str(ROOT))} && env PYTHONPATH={shlex.quote(str(ROOT))} "
                      f"TMPDIR={shlex.quote(scratch)} "
                      f"GLOO_SOCKET_IFNAME={shlex.quote(args.ifname)} OMP_NUM_THREADS=1 "
                      + shlex.join([device.python or "python3", "-m", "torch.distributed.run", "--nnodes", str(len(names)),
                                    "--nproc-per-node", "1", "--node-rank", str(rank), "--master-addr", master,
                                    "--master-port", str(port), *worker]))
            procs.append(subprocess.Popen(ssh_command(cluster, device, remote), stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True))
        outputs = peer_outputs(mode, names, procs, args.timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    wall = time.perf_counter() - began
    ranks = []
    for name, p, out in zip(names, procs, outputs):
        found = [line.strip()[len(RESULT_PREFIX):] for line in out.splitlines() if line.strip().startswith(RESULT_PREFIX)]
        if p.returncode != 0 or not found:
            raise RuntimeError(f"{mode} on {name} exited {p.returncode} without a result:\n{output_tail(out)}")
        ranks.append(json.loads(found[-1]))
    step_s = peer_step_s(ranks)
    losses = next(r["losses"] for r in ranks if r["losses"] is not None)
    return {"strategy": mode, "hosts": names, "stages": stages, "micro_batch": micro,
            "measured_samples_per_s": median_samples_per_s(step_s, args.global_batch, args.warmup),
            "step_s": step_s, "losses": losses, "wall_s": wall, "load_average_before": load_before,
            "load_average_after": os.getloadavg()[0]}


OUTPUT_TAIL_LINES = 60
"""Of a failed rank's output: enough to hold the worker's own error (a C++ abort message, a Python
traceback) above torch.distributed.run's 15-line summary of it."""


def output_tail(out: str) -> str:
    return "\n".join(out.splitlines()[-OUTPUT_TAIL_LINES:])


def peer_outputs(mode: str, names: list[str], procs: list, timeout: float) -> list[str]:
    """Every rank's output (stdout and stderr) once all have exited; past `timeout` seconds in all, kill
    them and raise with what each had printed, so that a hang says where each rank was."""
    deadline = time.monotonic() + timeout
    try:
        return [p.communicate(timeout=max(0.0, deadline - time.monotonic()))[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        printed = [p.communicate()[0] or "" for p in procs]
        ranks = "\n".join(f"--- {name} (exit {p.returncode}):\n{output_tail(out)}"
                           for name, p, out in zip(names, procs, printed))
        raise RuntimeError(f"{mode} did not finish within {timeout:g} s; each rank's output:\n{ranks}") from None


def layout_of(name: str, plans: dict, cluster, args) -> tuple[Layout, int]:
    if is_peer(name):
        mode, pp_key = peer_mode(name)
        layers = plans[pp_key].stages[-1].layers[1] if pp_key in plans else len(layer_costs(args.model, args.granularity))
        return peer_layout(mode, plans.get(pp_key), layers, args.global_batch, len(cluster.devices))
    return plan_layout(plans[name]), plans[name].micro_batch


def run_one(name: str, cluster, profile, plans: dict, args, port: int) -> dict:
    if is_peer(name):
        mode, pp_key = peer_mode(name)
        names, stages = peer_hosts(name, cluster, plans)
        micro = plans[pp_key].micro_batch if pp_key in plans else args.global_batch
        return run_peer(mode, cluster, names, stages, micro, args, port)
    r = hvb.run_strategy(name, profile, cluster, args, plan=plans[name])
    r["micro_batch"] = plans[name].micro_batch
    return r


def drop_unrunnable_peers(args, plans: dict) -> None:
    """Take out of `args.strategy_list`, with a line each, the peers whose torch schedule refuses their plan
    (`peer_worker.schedule_refusal`): found after planning, before the first run, instead of as a crash
    after every strategy before it has run."""
    keep = []
    for name in args.strategy_list:
        mode, pp_key = peer_mode(name)
        pp = plans.get(pp_key)
        refusal = schedule_refusal(mode, pp.num_micro_batches, len(pp.stages)) if pp else None
        if refusal:
            print(f"{name}: skipped, {refusal}", flush=True)
        else:
            keep.append(name)
    args.strategy_list = keep


def measure(cluster, profile, args) -> dict:
    """Plan, check first losses' references, alternate the strategies; every figure."""
    hppctl_names = [s for s in args.strategy_list if not is_peer(s)]
    pp_keys = [peer_mode(s)[1] for s in args.strategy_list if s.startswith("pipe-")]
    plans = {name: hvb.plan_for(name, profile, args, cluster if name in hppctl_names else None)
             for name in dict.fromkeys(hppctl_names + pp_keys) if "@" not in name}
    plans.update({key: pp_at(key, profile, args) for key in pp_keys if "@" in key})
    if args.peer_plan and "pp" in plans:
        from hppctl.models.plan import HppPlan
        from hppctl.store import load

        plans["pp"] = load(args.peer_plan, HppPlan)
    for name, plan in plans.items():
        print(f"plan {name}: micro-batch {plan.micro_batch}, stages "
              + " | ".join(f"{s.layers[0]}-{s.layers[1]} on {'+'.join(s.devices)}" for s in plan.stages), flush=True)
    drop_unrunnable_peers(args, plans)
    references = {s: reference_loss(args.model, args.granularity, *layout_of(s, plans, cluster, args), args.global_batch)
                  for s in args.strategy_list}
    cycles, runs = [], {s: [] for s in args.strategy_list}
    port = args.master_port
    for i in range(args.repeat):
        cycle = {}
        for name in args.strategy_list:
            print(f"cycle {i + 1}/{args.repeat}: {name} …", flush=True)
            r = run_one(name, cluster, profile, plans, args, port)
            port += 1
            runs[name].append(r)
            cycle[name] = r["measured_samples_per_s"]
            print(f"  {r['measured_samples_per_s']:.1f} samples/s, wall {r['wall_s']:.0f} s, load average "
                  f"{r['load_average_before']:.2f} -> {r['load_average_after']:.2f}", flush=True)
        cycles.append(cycle)
    checks = loss_checks({s: runs[s][0]["losses"][0] for s in args.strategy_list}, references)
    return {"plans": {k: {"micro_batch": p.micro_batch, "stages": [{"layers": s.layers, "devices": s.devices,
                                                                     "samples": s.samples} for s in p.stages]}
                      for k, p in plans.items()},
            "cycles": cycles, "summary": summarize(cycles), "loss_checks": checks, "runs": runs}


def main(argv=None) -> int:
    from hppctl.models.cluster import ClusterSpec
    from hppctl.models.profile import Profile
    from hppctl.store import load

    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="hpp-peers-"))
    spec = HOMOGENEOUS_SPEC if args.homogeneous else hvb.SPEC
    started = not args.cluster
    began = time.time()
    try:
        cluster_file, profile_file, started = hvb.lab_and_profile(args, work, spec)
        cluster, profile = load(cluster_file, ClusterSpec), load(profile_file, Profile)
        print(f"{args.model} ({profile.granularity}) on {cluster.name} ({len(cluster.devices)} hosts): global batch "
              f"{args.global_batch}, micro-batch {args.micro_batch}, {args.rounds} rounds (warm-up {args.warmup}), "
              f"{args.repeat} cycles; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
              f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
        figures = measure(cluster, profile, args)
    finally:
        if started and not args.keep:
            hvb.sh(*hvb.HPPCTL, "lab", "down", "--name", args.lab_name)
    print()
    print(table(figures["summary"], figures["cycles"]))
    print()
    for c in figures["loss_checks"]:
        verdict = "unchecked" if c["ok"] is None else ("ok" if c["ok"] else "MISMATCH")
        ref = f"{c['reference']:.5f}" if c["reference"] is not None else "-"
        print(f"first-step loss {c['strategy']:<11} {c['loss']:.5f}  reference {ref}  {verdict}")
    print(f"\n{time.time() - began:.0f} s in all; load average now {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        doc = {"args": {k: v for k, v in vars(args).items()}, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ",
               time.gmtime(began)), **figures}
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if all(c["ok"] is not False for c in figures["loss_checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
