"""Gradient AllReduce overlapped with the last backward (runtime/reducer.py) against all of it after.

    python bench/allreduce_overlap.py                       # mobilenetv2, 2 local workers, batch 64, M = 1
    python bench/allreduce_overlap.py --devices 3 --global-batch 96 --repeat 5

`dp` as a plan: one stage of every layer on `--devices` local workers (samples split evenly), one
micro-batch per round, so the whole AllReduce follows the one backward of the round, the case
DistributedDataParallel overlaps. The same run twice per repeat, alternating: `allreduce_overlap`
on (buckets started from the gradient hooks) and off (every bucket after the backward, the path
before issue 28). Both are the runtime's real code paths (TrainOptions.allreduce_overlap).

Per run: the median over rounds after `--warmup` of the round (the slowest worker's `duration_s`)
and of the exposed AllReduce (the slowest worker's `allreduce_s`, the wait at AR). The ratio is
off / on per repeat (> 1: the overlap is faster), and its median over repeats.

On this machine the workers share two cores, so gloo's summing competes with the backward for CPU:
the overlap hides link time, not CPU time (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hppctl.models.cluster import ClusterSpec, DeviceSpec  # noqa: E402
from hppctl.planner.manual import manual_plan  # noqa: E402
from hppctl.runtime.config import TrainOptions  # noqa: E402
from hppctl.runtime.session import RunRequest, Session  # noqa: E402
from hppctl.zoo import layer_costs  # noqa: E402


def even_split(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def run_once(args, overlap: bool) -> tuple[float, float]:
    """(median round s, median exposed AllReduce s) of one run, the slowest worker per round."""
    devices = [f"dev{i}" for i in range(args.devices)]
    layers = len(layer_costs(args.model, "fine"))
    plan = manual_plan(args.model, [((0, layers), devices, even_split(args.global_batch, args.devices))],
                       global_batch=args.global_batch, micro_batch=args.global_batch)
    cluster = ClusterSpec(name="overlap", devices=[DeviceSpec(name=d, local=True) for d in devices])
    options = TrainOptions(dataset="digits", seed=0, rounds=args.rounds, optimizer="sgd", lr=0.01,
                           threads=args.threads, allreduce_overlap=overlap)
    rows: list[dict] = []
    Session(RunRequest(plan, cluster, options)).run(on_round=rows.append)
    steady = rows[args.warmup:]
    round_s = statistics.median(max(r["devices"][d]["duration_s"] for d in devices) for r in steady)
    exposed_s = statistics.median(max(r["devices"][d]["allreduce_s"] for d in devices) for r in steady)
    return round_s, exposed_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mobilenetv2")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(f"allreduce overlap: {args.model}, dp on {args.devices} local workers, global batch {args.global_batch} "
          f"(one micro-batch), {args.rounds} rounds, {args.threads} thread(s); load average before: "
          f"{os.getloadavg()[0]:.2f}")
    ratios = []
    for i in range(args.repeat):
        first, second = (True, False) if i % 2 == 0 else (False, True)  # alternate which side goes first
        figures = {first: run_once(args, first), second: run_once(args, second)}
        (on_round, on_ar), (off_round, off_ar) = figures[True], figures[False]
        ratios.append(off_round / on_round)
        print(f"  repeat {i}: overlap on {on_round * 1e3:7.1f} ms/round (AR wait {on_ar * 1e3:6.1f} ms) | "
              f"off {off_round * 1e3:7.1f} ms/round (AR wait {off_ar * 1e3:6.1f} ms) | off/on {ratios[-1]:.3f}")
    print(f"median off/on round-time ratio: {statistics.median(ratios):.3f} (> 1: overlap faster); "
          f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
