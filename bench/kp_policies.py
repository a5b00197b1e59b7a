"""Asteroid Fig. 15b: K_p policies on a 3-stage, 3 x Jetson TX2 EfficientNet-B1 pipeline.

    python bench/kp_policies.py [--micro-batches 32,64] [--bandwidths 100mbit,1gbit]

Builds a preset profile of efficientnet-b1 (fine) on three TX2s with `hppctl profile`, cuts the
model into the 3-stage pipeline (one TX2 per stage) with the lowest closed-form round latency, and
simulates one round (global batch 2048, as in the paper) under each warm-up policy:
(a) 2(P-p), (b) P-p, (c) 2(P-p)+1, ours 2(P-p)-1, and GPipe (all forwards first). Per stage it
prints the peak memory the simulator observes (Eq. 3 with the micro-batches actually in flight:
weights + gradients + optimizer state + activations), and the round's throughput. For reference,
the last row is DP (the whole model replicated on the three TX2s). Figures are in docs/schedule.md.
The paper's claim: ours has throughput comparable to (a) and (c) with the smallest peak memory.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
HPPCTL = [sys.executable, "-m", "hppctl"]

from hppctl import planner  # noqa: E402
from hppctl.models.plan import PlanRequest  # noqa: E402
from hppctl.models.profile import Profile  # noqa: E402
from hppctl.models.units import parse_rate  # noqa: E402
from hppctl.planner.cost import StageChoice, round_latency  # noqa: E402
from hppctl.planner.registry import Candidate  # noqa: E402
from hppctl.schedule import simulate_plan, warmups  # noqa: E402
from hppctl.store import load  # noqa: E402

POLICIES = [("(a) 2(P-p)", "2(P-p)"), ("(b) P-p", "P-p"), ("(c) 2(P-p)+1", "2(P-p)+1"),
            ("ours 2(P-p)-1", "2(P-p)-1"), ("GPipe (no 1F1B)", "gpipe")]
GLOBAL_BATCH = 2048


def profile_for(bandwidth: str, tmp: Path) -> Profile:
    cluster = tmp / f"3xtx2-{bandwidth}.yaml"
    cluster.write_text(f"name: 3xtx2-{bandwidth}\nbandwidth: {bandwidth}\ndevices:\n"
                       + "".join(f"  - {{name: tx{i}, preset: jetson-tx2}}\n" for i in range(3)))
    out = tmp / f"3xtx2-{bandwidth}-efficientnet-b1.json"
    subprocess.run(HPPCTL + ["profile", "--cluster", str(cluster), "--model", "efficientnet-b1", "--granularity",
                             "fine", "--out", str(out)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return load(out, Profile)


def best_three_stage(cm) -> list[StageChoice]:
    """The cut points (i, j) of tx0 | tx1 | tx2 with the lowest closed-form round latency."""
    L, B, M = cm.num_layers, cm.B, cm.M
    prefix = [[cm.forward_time(d, 0, end, B) for end in range(L + 1)] for d in range(3)]
    back = [[cm.backward_time(d, 0, end, B) for end in range(L + 1)] for d in range(3)]
    best, best_value = None, float("inf")
    for i in range(1, L - 1):
        for j in range(i + 1, L):
            steps = []
            for d, (a, b) in enumerate(((0, i), (i, j), (j, L))):
                steps.append(planner.cost.Step(prefix[d][b] - prefix[d][a], back[d][b] - back[d][a]))
            c1 = cm.transfer_time(i, (0,), (1,))
            c2 = cm.transfer_time(j, (1,), (2,))
            full = [steps[0], planner.cost.Step(c1, c1), steps[1], planner.cost.Step(c2, c2), steps[2]]
            value = round_latency(full, M)
            if value < best_value:
                best, best_value = (i, j), value
    i, j = best
    return [StageChoice(0, i, (0,), (B,)), StageChoice(i, j, (1,), (B,)), StageChoice(j, L, (2,), (B,))]


def dp_stage(cm) -> list[StageChoice]:
    share = [cm.B // 3 + (1 if k < cm.B % 3 else 0) for k in range(3)]
    return [StageChoice(0, cm.num_layers, (0, 1, 2), tuple(share))]


def run(bandwidth: str, micro: int, tmp: Path, profiles: dict) -> None:
    profile = profiles.setdefault(bandwidth, profile_for(bandwidth, tmp))
    request = PlanRequest(global_batch=GLOBAL_BATCH, micro_batch=micro)
    cm = planner.cost_model(profile, request)
    stages = best_three_stage(cm)
    plan = planner.to_plan(cm, profile, request, "manual", Candidate(stages), 0.0)
    print(f"\n{bandwidth}, micro-batch {micro} (M = {request.num_micro_batches}): layers "
          + " | ".join(f"[{s.start}, {s.end})" for s in stages)
          + f"; E_f+E_b per stage " + ", ".join(f"{s.forward_s + s.backward_s:.3f}" for s in plan.stages) + " s"
          + f"; transfer per micro-batch " + ", ".join(f"{t.forward_s:.3f}" for t in plan.transfers) + " s")
    print(f"{'policy':<18} {'K_p':<11} {'samples/s':>10} {'vs ours':>8}   "
          f"{'peak memory per stage (MB)':<30} {'max MB':>8} {'vs ours':>8}")
    rows = []
    for label, policy in POLICIES:
        _, result = simulate_plan(plan, profile, policy=policy)
        ks = warmups(policy, 3, request.num_micro_batches)
        mem = [d.peak_memory_bytes / 1e6 for d in sorted(result.devices, key=lambda d: d.stage)]
        rows.append((label, ks, result.throughput_samples_per_s, mem))
    ours = next(r for r in rows if r[0].startswith("ours"))
    for label, ks, thr, mem in rows:
        print(f"{label:<18} {','.join(map(str, ks)):<11} {thr:>10.1f} {thr / ours[2]:>8.2f}   "
              f"{' / '.join(f'{m:.0f}' for m in mem):<30} {max(mem):>8.0f} {max(mem) / max(ours[3]):>8.2f}")
    dp_plan = planner.to_plan(cm, profile, request, "dp", Candidate(dp_stage(cm)), 0.0)
    _, result = simulate_plan(dp_plan, profile)
    mem = [d.peak_memory_bytes / 1e6 for d in result.devices]
    print(f"{'DP (3 replicas)':<18} {'1':<11} {result.throughput_samples_per_s:>10.1f} "
          f"{result.throughput_samples_per_s / ours[2]:>8.2f}   {' / '.join(f'{m:.0f}' for m in mem):<30} "
          f"{max(mem):>8.0f} {max(mem) / max(ours[3]):>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--micro-batches", default="32,64")
    parser.add_argument("--bandwidths", default="100mbit,1gbit")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hppctl-kp-"))
    profiles: dict = {}
    print("3 x Jetson TX2 (preset profile), efficientnet-b1 fine, global batch 2048; simulated one round per policy")
    for bandwidth in args.bandwidths.split(","):
        parse_rate(bandwidth)
        for micro in (int(x) for x in args.micro_batches.split(",")):
            run(bandwidth, micro, tmp, profiles)


if __name__ == "__main__":
    main()
