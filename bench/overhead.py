"""Runtime overhead: a single-device plan under `hppctl run`'s runtime against a plain PyTorch loop.

    python bench/overhead.py                       # mobilenetv2, digits, batch 64, 40 rounds, 3 repeats
    python bench/overhead.py --model tiny-cnn --rounds 200

Both sides train the same model (same seed) on the same samples in the same order (digits, resized
to the model's input, order from (seed, epoch)), with the same optimizer, batch and thread count:

- plain: in a fresh interpreter (as the worker is), `loss = cross_entropy(model(x), y); zero_grad; backward; step` per round;
- runtime: one worker process of the runtime (rendezvous, gloo, the plan's schedule interpreted
  action by action, per-round metrics through the store), started by `Session.run`.

The figure is the median time per round after the first `--warmup` rounds (steady state, what a
long run pays), for the plain loop measured in-process and for the runtime as the worker's own
round time (the metrics' `duration_s`) and as the interval between round ends seen by the
launcher (`round_s`). Start-up (processes, imports, rendezvous) is reported separately. Repeats
alternate the two sides so that other load on the machine hits both alike. Target: <= 1.10x.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from hppctl.models.cluster import ClusterSpec, DeviceSpec  # noqa: E402
from hppctl.runtime.config import TrainOptions  # noqa: E402
from hppctl.runtime.data import SampleOrder, load_data  # noqa: E402
from hppctl.planner.manual import manual_plan  # noqa: E402
from hppctl.runtime.session import RunRequest, Session  # noqa: E402
from hppctl.runtime.worker import make_optimizer  # noqa: E402
from hppctl.zoo import get_model, layer_costs  # noqa: E402


def plain_loop(model_name: str, options: TrainOptions, global_batch: int) -> list[float]:
    torch.set_num_threads(options.threads)
    data = load_data(options.dataset, model_name)
    order = SampleOrder(len(data.train), global_batch, global_batch, options.seed)
    model = get_model(model_name).build(seed=options.seed).train()
    opt = make_optimizer(model.parameters(), options)
    times = []
    for r in range(options.rounds):
        begin, cpu = time.perf_counter(), time.process_time()
        x, y = data.train.take(order.indices(r, 0, 0, global_batch))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - begin, time.process_time() - cpu))
    return times


def plain_in_fresh_process(args, options: TrainOptions) -> list[float]:
    """The plain loop in its own interpreter, as the runtime's worker is (same imports, clean heap)."""
    import json
    import subprocess

    out = subprocess.run([sys.executable, __file__, "--plain-only", "--model", args.model, "--global-batch",
                          str(args.global_batch), "--rounds", str(args.rounds), "--threads", str(args.threads)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def runtime_loop(model_name: str, options: TrainOptions, global_batch: int, micro_batch: int):
    layers = len(layer_costs(model_name, "fine"))
    plan = manual_plan(model_name, [((0, layers), ["dev0"], [micro_batch])], global_batch=global_batch,
                       micro_batch=micro_batch)
    cluster = ClusterSpec(name="one", devices=[DeviceSpec(name="dev0", local=True)])
    begin = time.perf_counter()
    rows = []
    result = Session(RunRequest(plan, cluster, options)).run(on_round=rows.append)
    wall = time.perf_counter() - begin
    first_end = rows[0]["ended_at"]
    return rows, wall, result, first_end


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mobilenetv2")
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=None, help="default: the global batch (M = 1)")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads on both sides (1: two OpenMP threads collapse when other jobs hold a core)")
    parser.add_argument("--plain-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    micro = args.micro_batch or args.global_batch
    options = TrainOptions(dataset="digits", seed=0, rounds=args.rounds, optimizer="sgd", lr=0.01,
                           threads=args.threads)
    if args.plain_only:
        import json

        print(json.dumps(plain_loop(args.model, options, args.global_batch)))
        return
    print(f"overhead: {args.model}, digits, global batch {args.global_batch} (micro-batch {micro}), "
          f"{args.rounds} rounds, {args.threads} threads; load average before: {os.getloadavg()[0]:.2f}")
    results = {"plain wall": [], "plain cpu": [], "runtime wall": [], "runtime cpu": [], "launcher wall": [], "start-up": []}
    w = args.warmup
    for i in range(args.repeat):
        plain = plain_in_fresh_process(args, options)
        rows, wall, _, _ = runtime_loop(args.model, options, args.global_batch, micro)
        dev = [r["devices"]["dev0"] for r in rows]
        figures = {
            "plain wall": statistics.median(t for t, _ in plain[w:]),
            "plain cpu": statistics.median(c for _, c in plain[w:]),
            "runtime wall": statistics.median(d["duration_s"] for d in dev[w:]),
            "runtime cpu": statistics.median(d["cpu_s"] for d in dev[w:]),
            "launcher wall": statistics.median(r["round_s"] for r in rows[w:]),
            "start-up": wall - sum(r["round_s"] for r in rows[1:]),
        }
        for k, v in figures.items():
            results[k].append(v)
        print(f"  repeat {i}: plain {figures['plain wall'] * 1e3:6.1f} ms wall {figures['plain cpu'] * 1e3:6.1f} ms cpu"
              f" | runtime {figures['runtime wall'] * 1e3:6.1f} ms wall {figures['runtime cpu'] * 1e3:6.1f} ms cpu"
              f" (launcher sees {figures['launcher wall'] * 1e3:6.1f} ms) | wall ratio "
              f"{figures['runtime wall'] / figures['plain wall']:.3f}, cpu ratio {figures['runtime cpu'] / figures['plain cpu']:.3f}"
              f" | start-up {figures['start-up']:.1f} s")
    m = {k: statistics.median(v) for k, v in results.items()}
    print(f"median of repeats, per round: plain {m['plain wall'] * 1e3:.1f} ms wall / {m['plain cpu'] * 1e3:.1f} ms cpu; "
          f"runtime {m['runtime wall'] * 1e3:.1f} ms wall / {m['runtime cpu'] * 1e3:.1f} ms cpu; "
          f"launcher interval {m['launcher wall'] * 1e3:.1f} ms")
    print(f"ratio runtime/plain: wall {m['runtime wall'] / m['plain wall']:.3f} (launcher interval "
          f"{m['launcher wall'] / m['plain wall']:.3f}), cpu {m['runtime cpu'] / m['plain cpu']:.3f}; target <= 1.10; "
          f"start-up {m['start-up']:.1f} s once per run; load average after: {os.getloadavg()[0]:.2f}")
    b = {k: min(v) for k, v in results.items()}
    print(f"best of repeats (least disturbed by other load): wall {b['runtime wall'] / b['plain wall']:.3f}, "
          f"cpu {b['runtime cpu'] / b['plain cpu']:.3f}")


if __name__ == "__main__":
    main()
