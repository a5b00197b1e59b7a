"""TiMePReSt (nf1b) against PipeDream (1F1B, weight stashing) and the synchronous HPP schedule, trained
for real on the edge lab, epoch by epoch.

    sudo python bench/timeprest.py                         # lab up (2 hosts x 0.5 core, 100 Mbit/s), 3 schedules, lab down
    sudo python bench/timeprest.py --hosts 3 --cuts 5,12   # 3 stages
    python bench/timeprest.py --cluster C.yaml --epochs 6 --out results.json     # a lab that is up

The paper (seeds/003 §5) ran VGG-16 on CIFAR-100/Tiny-ImageNet over 2 single-GPU machines against
PipeDream and reports faster time to accuracy, more epochs per hour, *worse* accuracy per epoch,
and about 50% / 40% less GPU memory on stages 0 / 1. Here: `vgg-mini` (a VGG-style CNN, zoo) on
scikit-learn's digits resized to 32x32, one lab host per stage, the same mini-batch for all three:

- `nf1b`: mini-batch = `--micro-batches` N micro-batches; backward with the latest weights
  (recomputed stage forward), no weight stash, in-flight cap (docs/timeprest.md);
- `pipedream`: the mini-batch unsplit, 1F1B with NOAM = W, weight stashing (vertical sync too);
- `hpp`: hppctl's synchronous 1F1B round (Asteroid K_p) over the same N micro-batches: exact
  mini-batch SGD, a flush after every mini-batch.

Every schedule trains `--epochs` epochs in one `hppctl run` session with a per-stage checkpoint after
every epoch (all kept); the test accuracy of each epoch is measured on its checkpoint afterwards.
Time per epoch is the sum of the epoch's round times (an asynchronous window is one round; worker
start-up is not counted); memory is each worker's peak resident set above its own pre-weight
baseline (weights, stashed versions, activations, optimizer state, allocator slack).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from hpp_vs_baselines import HPPCTL, sh  # noqa: E402

from hppctl.lab.network import free_subnet  # noqa: E402
from hppctl.models.cluster import ClusterSpec  # noqa: E402
from hppctl.runtime import checkpoint  # noqa: E402
from hppctl.runtime.async_exec.plans import epoch_schedule  # noqa: E402
from hppctl.runtime.config import TrainOptions  # noqa: E402
from hppctl.runtime.data import load_data  # noqa: E402
from hppctl.planner.manual import manual_plan  # noqa: E402
from hppctl.runtime.results import accuracy  # noqa: E402
from hppctl.runtime.session import RunRequest, Session  # noqa: E402
from hppctl.schedule.async_check import versions_held  # noqa: E402
from hppctl.schedule.async_version import simulated_version_difference  # noqa: E402
from hppctl.store import load  # noqa: E402

LAB = """name: {name}
bandwidth: 100mbit
subnet: {subnet}
hosts:
{hosts}"""
LAYERS = 21  # vgg-mini, fine


def lab(args, work: Path) -> tuple[Path, bool]:
    if args.cluster:
        return Path(args.cluster), False
    hosts = "".join(f"  - {{name: vm{i}, cpu: {args.cpu}, memory: 1GB}}\n" for i in range(args.hosts))
    spec = work / "lab.yaml"
    spec.write_text(LAB.format(name=args.lab_name, subnet=free_subnet(first=240), hosts=hosts))
    cluster = work / "cluster.yaml"
    sh(*HPPCTL, "lab", "up", "--spec", spec, "--out", cluster)
    return cluster, True


def make_plan(schedule: str, cluster: ClusterSpec, args):
    cuts = [0, *(int(c) for c in args.cuts.split(",")), LAYERS]
    devices = [d.name for d in cluster.devices][:len(cuts) - 1]
    G, N = args.mini_batch, args.micro_batches
    B = G if schedule == "pipedream" else G // N
    stages = [((a, b), [d], [B]) for (a, b), d in zip(zip(cuts, cuts[1:]), devices)]
    return manual_plan(args.model, stages, global_batch=G, micro_batch=B)


def train_schedule(name: str, cluster: ClusterSpec, args, work: Path) -> dict:
    plan = make_plan(name, cluster, args)
    window = None if name == "hpp" else epoch_schedule(plan, name, "digits")
    data = load_data("digits", args.model)
    per_epoch = 1 if window is not None else len(data.train) // plan.global_batch
    ckpt = work / f"ckpt-{name}"
    options = TrainOptions(dataset="digits", seed=0, rounds=args.epochs * per_epoch, optimizer=args.optimizer,
                           lr=args.lr, checkpoint_every=per_epoch, threads=1, timeout_s=args.timeout)
    rows: list[dict] = []
    checkpoint.KEEP = 10**6  # keep every epoch's checkpoint: the test accuracy of each is measured afterwards
    result = Session(RunRequest(plan, cluster, options, checkpoint_dir=ckpt, schedule=window)).run(on_round=rows.append)
    epochs, clock = [], 0.0
    for e in range(1, args.epochs + 1):
        mine = rows[(e - 1) * per_epoch:e * per_epoch]
        epoch_s = sum(r["round_s"] for r in mine)
        clock += epoch_s
        test = accuracy(args.model, _state(ckpt, e * per_epoch), data.test)
        epochs.append({"epoch": e, "epoch_s": epoch_s, "wall_clock_s": clock, "test_accuracy": test,
                       "train_loss": statistics.fmean(r["loss"] for r in mine),
                       "train_accuracy": statistics.fmean(r["train_accuracy"] for r in mine)})
        print(f"  {name} epoch {e}: {epoch_s:6.1f} s, loss {epochs[-1]['train_loss']:.3f}, test accuracy {test:.1%}",
              flush=True)
    devices = plan.devices()
    growth = {d: m["peak_rss_bytes"] - m["baseline_rss_bytes"] for d, m in result.workers.items()}
    print(f"  memory growth " + ", ".join(f"{d} {g / 2**20:.1f} MiB" for d, g in growth.items()), flush=True)
    return {
        "schedule": name, "devices": devices, "stages": [list(s.layers) for s in plan.stages],
        "mini_batch": plan.global_batch, "micro_batch": plan.micro_batch,
        "versions_held": versions_held(window) if window is not None else {d: 1 for d in devices},
        "epoch_s_median": statistics.median(x["epoch_s"] for x in epochs),
        "epochs_per_hour": 3600 / statistics.median(x["epoch_s"] for x in epochs),
        "peak_growth_bytes": growth, "peak_rss_bytes": {d: m["peak_rss_bytes"] for d, m in result.workers.items()},
        "wall_s": result.wall_s, "epochs": epochs,
    }


def _state(ckpt: Path, round_index: int) -> dict:
    """The whole model's state dict from one round's per-stage checkpoint files."""
    import torch

    merged = {}
    for f in sorted((ckpt / f"round-{round_index:08d}").glob("stage-*.pt")):
        merged.update(torch.load(f, weights_only=True)["model"])
    return merged


def report(results: list[dict], args) -> None:
    W = len(results[0]["devices"])
    v = simulated_version_difference(W, args.micro_batches)
    print(f"\nvgg-mini on digits, {W} stages, mini-batch {args.mini_batch} (nf1b/hpp: {args.micro_batches} micro-batches); "
          f"nf1b version difference v = {v.simulated} (paper's formula {v.paper})")
    print(f"{'schedule':<10} {'s/epoch':>8} {'epochs/h':>9}   test accuracy by epoch   [cumulative s]   "
          f"peak memory growth per stage (MiB), weight versions held")
    for r in results:
        accs = " ".join(f"{x['test_accuracy']:.0%}" for x in r["epochs"])
        clocks = " ".join(f"{x['wall_clock_s']:.0f}" for x in r["epochs"])
        mem = " ".join(f"{r['peak_growth_bytes'][d] / 2**20:.1f}" for d in r["devices"])
        held = " ".join(str(r["versions_held"][d]) for d in r["devices"])
        print(f"{r['schedule']:<10} {r['epoch_s_median']:8.1f} {r['epochs_per_hour']:9.1f}   {accs:<24} [{clocks}]   {mem}  ({held})")
    by = {r["schedule"]: r for r in results}
    if "nf1b" in by and "pipedream" in by:
        a, b = by["nf1b"], by["pipedream"]
        per_stage = ", ".join(f"stage {p} {a['peak_growth_bytes'][da] / b['peak_growth_bytes'][db] - 1:+.0%}"
                              for p, (da, db) in enumerate(zip(a["devices"], b["devices"])))
        print(f"nf1b vs pipedream: time per epoch {a['epoch_s_median'] / b['epoch_s_median'] - 1:+.0%}, memory growth "
              f"{per_stage} (paper: about -50% stage 0, -40% stage 1)")
    for name in ("nf1b", "pipedream"):
        if name in by and "hpp" in by:
            a, b = by[name], by["hpp"]
            print(f"{name} vs hpp: time per epoch {a['epoch_s_median'] / b['epoch_s_median'] - 1:+.0%}, final test "
                  f"accuracy {a['epochs'][-1]['test_accuracy']:.1%} vs {b['epochs'][-1]['test_accuracy']:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", help="cluster file of a lab that is up (default: bring one up)")
    parser.add_argument("--hosts", type=int, default=2, help="lab hosts = stages (2-4)")
    parser.add_argument("--cpu", type=float, default=0.5, help="cores per lab host")
    parser.add_argument("--cuts", default="10", help="fine-layer cut points of vgg-mini (21 layers), one fewer than hosts")
    parser.add_argument("--model", default="vgg-mini")
    parser.add_argument("--mini-batch", type=int, default=64)
    parser.add_argument("--micro-batches", type=int, default=4, help="N of nf1b and of the synchronous round")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--optimizer", default="adam", help="adam (default) or sgd (momentum 0.9)")
    parser.add_argument("--lr", type=float, default=0.001,
                        help="vgg-mini has no BatchNorm: SGD at 0.02-0.1 stays at chance for 4 epochs, Adam 1e-3 learns")
    parser.add_argument("--schedules", default="nf1b,pipedream,hpp")
    parser.add_argument("--lab-name", default="timeprest")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--keep", action="store_true", help="leave a lab this script brought up")
    parser.add_argument("--out", help="write every figure as JSON")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="timeprest-"))
    cluster_file, started = lab(args, work)
    try:
        cluster = load(cluster_file, ClusterSpec)
        print(f"lab {cluster.name}: {len(cluster.devices)} hosts; machine {os.cpu_count()} cores, load average "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        results = []
        for name in args.schedules.split(","):
            began = time.perf_counter()
            print(f"training {name} …", flush=True)
            results.append(train_schedule(name, cluster, args, work))
            print(f"  ({time.perf_counter() - began:.0f} s with start-ups)", flush=True)
        report(results, args)
        if args.out:
            Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=2) + "\n")
    finally:
        if started and not args.keep:
            sh(*HPPCTL, "lab", "down", "--name", args.lab_name)


if __name__ == "__main__":
    main()
