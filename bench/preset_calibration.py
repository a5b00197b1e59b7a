"""Device presets vs the Asteroid paper's Table 1 (average epoch time of on-device training).

Predicted epoch time = (samples per epoch / β) x sum over layers of (forward + backward) at batch β,
from the preset model (hppctl/profiling/presets.py) and the zoo's fine layer sequence. The paper
does not give the batch size behind Table 1, so several are shown. Datasets: CIFAR-10 has 50,000
training images; Mini-ImageNet has 60,000 images in all (the paper does not say which split).

    python bench/preset_calibration.py            # table
    python bench/preset_calibration.py --json     # one JSON document
"""

from __future__ import annotations

import argparse
import json
import sys

from hppctl.profiling.from_presets import layer_times
from hppctl.profiling.presets import PRESETS
from hppctl.zoo import layer_costs

# Table 1 of the paper: (Jetson TX2 seconds, Jetson Nano seconds, samples per epoch)
TABLE1 = {
    "efficientnet-b1": (11.2 * 60, 26.7 * 60, 50_000),
    "mobilenetv2": (8.5 * 60, 22.0 * 60, 50_000),
    "resnet50": (1.14 * 3600, 3.48 * 3600, 60_000),
}
BATCHES = (8, 16, 32, 64)
DEVICES = ("jetson-tx2", "jetson-nano", "jetson-nx", "jetson-orin-nano", "rpi4", "laptop-cpu")


def epoch_seconds(device: str, layers, batch: int, samples: int) -> float:
    forward, backward = layer_times(PRESETS[device], layers, [batch])
    per_batch = sum(f[0] + b[0] for f, b in zip(forward, backward))
    return samples / batch * per_batch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for model, (tx2_paper, nano_paper, samples) in TABLE1.items():
        layers = layer_costs(model, "fine")
        flops = sum(l.forward_flops_per_sample for l in layers)
        for batch in BATCHES:
            predicted = {d: epoch_seconds(d, layers, batch, samples) for d in DEVICES}
            rows.append({
                "model": model, "layers": len(layers), "forward_mflop_per_sample": flops / 1e6, "batch": batch,
                "predicted_s": predicted, "paper_tx2_s": tx2_paper, "paper_nano_s": nano_paper,
                "tx2_vs_paper": predicted["jetson-tx2"] / tx2_paper,
                "nano_vs_paper": predicted["jetson-nano"] / nano_paper,
                "nano_over_tx2": predicted["jetson-nano"] / predicted["jetson-tx2"],
                "paper_nano_over_tx2": nano_paper / tx2_paper,
            })
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    print(f"{'model':16} {'batch':>5} {'TX2 pred':>9} {'paper':>7} {'x':>5} {'Nano pred':>9} {'paper':>7} {'x':>5} "
          f"{'Nano/TX2':>8} {'paper':>5} | " + " ".join(f"{d.removeprefix('jetson-'):>9}" for d in DEVICES[2:]))
    for r in rows:
        p = r["predicted_s"]
        print(f"{r['model']:16} {r['batch']:5d} {p['jetson-tx2'] / 60:8.1f}m {r['paper_tx2_s'] / 60:6.1f}m "
              f"{r['tx2_vs_paper']:5.2f} {p['jetson-nano'] / 60:8.1f}m {r['paper_nano_s'] / 60:6.1f}m "
              f"{r['nano_vs_paper']:5.2f} {r['nano_over_tx2']:8.2f} {r['paper_nano_over_tx2']:5.2f} | "
              + " ".join(f"{p[d] / 60:8.1f}m" for d in DEVICES[2:]))
    print("\nx = predicted / paper (1.00 is exact); epoch minutes; forward MFLOP per sample: "
          + ", ".join(sorted({f"{r['model']} {r['forward_mflop_per_sample']:.1f}" for r in rows})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
