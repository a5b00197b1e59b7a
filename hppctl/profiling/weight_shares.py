"""The weight-gradient share of the backward per preset layer class, measured on this machine.

    python -m hppctl.profiling.weight_shares --model mobilenetv2 --granularity fine --batch 8

Times `repeats` layer passes of the training probe (train_probe.Measurement.layer_pass: each
layer's backward and its weight-gradient part) after one warm-up, one thread, and prints per
preset class of a layer with parameters (presets.weight_grad_key: also `no-weights` and
`embedding`, whose shares presets.py fixes at 0 and 1) the summed median weight-gradient time over the summed median
backward time of the model's layers of that class, with the layer count. presets.py's
WEIGHT_GRAD_SHARE comes from these figures (docs/presets.md has the runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict


def class_shares(model: str, granularity: str, batch: int, repeats: int = 5) -> dict[str, dict[str, float]]:
    """{key: {"share": weight / backward, "layers": n, "backward_s": summed median backward}} per
    presets.weight_grad_key."""
    from hppctl.allocator import steady_heap
    from hppctl.profiling.presets import weight_grad_key
    from hppctl.profiling.train_probe import Measurement
    from hppctl.zoo import layer_costs

    steady_heap()  # the allocator the probe and the workers run with
    m = Measurement(model, granularity, threads=1)
    x, labels = m.batch(batch)
    m.first_step(x, labels)
    passes = [m.layer_pass(x, labels) for _ in range(repeats + 1)][1:]
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for i, layer in enumerate(layer_costs(model, granularity)):
        row = totals[weight_grad_key(layer)]
        row[0] += statistics.median(p[2][i] for p in passes)
        row[1] += statistics.median(p[1][i] for p in passes)
        row[2] += 1
    return {cls: {"share": w / b if b > 0 else 0.0, "layers": n, "backward_s": b}
            for cls, (w, b, n) in sorted(totals.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hppctl.profiling.weight_shares")
    parser.add_argument("--model", required=True)
    parser.add_argument("--granularity", default="fine", choices=["fine", "block"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    a = parser.parse_args(argv)
    shares = class_shares(a.model, a.granularity, a.batch, a.repeats)
    for cls, row in shares.items():
        print(f"{a.model} {a.granularity} b={a.batch} {cls:18} {row['layers']:4d} layers  "
              f"backward {row['backward_s'] * 1e3:8.2f} ms  weight share {row['share']:.2f}")
    sys.stdout.write(json.dumps({"model": a.model, "granularity": a.granularity, "batch": a.batch,
                                 "shares": shares}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
