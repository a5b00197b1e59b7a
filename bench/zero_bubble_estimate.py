"""What would splitting the backward (zero-bubble style) gain on a plan? An estimate, not a schedule hppctl runs.

    python bench/zero_bubble_estimate.py --profile /work/runs/envb-profile-auto-quiet.json --micro-batch 16

For each strategy's plan at the micro-batch (one device per stage only), the round is replayed twice
on the profile's times:

- **1F1B**: the plan's own compute order (K_p forwards, then one backward and one forward, ...), each
  backward whole. With every weight-gradient share 0 the replay is hppctl's simulator for such plans
  (checked in tests/planner/test_bench_zero_bubble.py, and printed beside it here);
- **W deferred**: the same order, each backward split into its input-gradient part (sent upstream at
  once) and its weight-gradient part W, a share of the backward measured on this machine
  (`pipeline_headroom.split_backward_shares`: fused against input-only autograd, one thread). A
  device runs pending W whenever the next forward or input-gradient it must run has no input yet,
  and the rest before its optimizer step (ZB-H1's idea: W fills the pipeline's waits; activations
  are kept until their W has run).

The first stage sends no input gradient, so its whole backward could be deferred; `--first-stage-share`
sets what is assumed (default: the smallest share measured on the other stages, a cautious guess).
Transfers as in the simulator: one message per micro-batch and direction, a device's sends one after
another on its uplink. A bench, not a test: it asserts nothing and prints figures for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from hppctl.models.plan import HppPlan, PlanRequest  # noqa: E402
from hppctl.models.profile import Profile  # noqa: E402
from hppctl.planner import make_plan  # noqa: E402
from hppctl.schedule import simulate_plan  # noqa: E402
from hppctl.schedule.generate import schedule_for_plan  # noqa: E402
from hppctl.schedule.timings import ProfileTimings  # noqa: E402
from hppctl.store import load  # noqa: E402


class Chain:
    """Per-stage times of a plan whose stages each run on one device, read from the simulator's own
    timings (`ProfileTimings`), and each device's compute order from the schedule hppctl would run."""

    def __init__(self, plan: HppPlan, profile: Profile):
        schedule = schedule_for_plan(plan)
        timings = ProfileTimings(profile, schedule)
        devices = [s.devices[0] for s in plan.stages]
        B = plan.micro_batch
        self.forward = [timings.compute_s(d, p, "F", B) for p, d in enumerate(devices)]
        self.backward = [timings.compute_s(d, p, "B", B) for p, d in enumerate(devices)]
        self.transfer = [timings.transfer_s(a, b, p, B) for p, (a, b) in enumerate(zip(devices, devices[1:]))]
        self.orders = [[(a.kind, a.micro_batch) for a in schedule.actions[d] if a.kind in ("F", "B")] for d in devices]
        self.samples = B * plan.num_micro_batches


def replay(plan: HppPlan, profile: Profile, weight_shares: list[float]) -> float:
    """Samples/s of one round with each stage's backward split by `weight_shares` (all 0: plain 1F1B)."""
    chain = Chain(plan, profile)
    last = len(plan.stages) - 1
    w = [share * b for share, b in zip(weight_shares, chain.backward)]
    b_input = [b - x for b, x in zip(chain.backward, w)]
    position, clock, uplink, pending = [0] * (last + 1), [0.0] * (last + 1), [0.0] * (last + 1), [0] * (last + 1)
    arrival = {("F", 0, m): 0.0 for m in range(plan.num_micro_batches)}  # (kind, stage, m): its input is there
    finished: dict[tuple, float] = {}

    def send(p: int, ready: float, seconds: float) -> float:
        uplink[p] = max(ready, uplink[p]) + seconds
        return uplink[p]

    progressed = True
    while progressed:
        progressed = False
        for p in range(last + 1):
            while position[p] < len(chain.orders[p]):
                kind, m = chain.orders[p][position[p]]
                # the last stage's backward starts from its own forward; every other op from an arrival
                ready = finished.get(("F", p, m)) if (kind, p) == ("B", last) else arrival.get((kind, p, m))
                if ready is None:
                    break  # its input comes from a stage not yet replayed this far
                while pending[p] and clock[p] < ready:  # the device would wait: weight gradients instead
                    clock[p] += w[p]
                    pending[p] -= 1
                end = max(clock[p], ready) + (chain.forward[p] if kind == "F" else b_input[p])
                clock[p] = finished[(kind, p, m)] = end
                position[p] += 1
                progressed = True
                if kind == "B":
                    pending[p] += 1
                if kind == "F" and p < last:
                    arrival[("F", p + 1, m)] = send(p, end, chain.transfer[p])
                if kind == "B" and p > 0:
                    arrival[("B", p - 1, m)] = send(p, end, chain.transfer[p - 1])
    if any(position[p] < len(chain.orders[p]) for p in range(last + 1)):
        raise RuntimeError("the compute order could not complete")
    round_s = max(max(c + n * x for c, n, x in zip(clock, pending, w)), max(uplink))
    return chain.samples / round_s


def measured_shares(plan: HppPlan, first_stage_share: float | None, repeats: int) -> list[float]:
    """Per stage, the weight-gradient share of its backward (stage 0: `first_stage_share` or the smallest other)."""
    from pipeline_headroom import split_backward_shares

    shares = [1 - input_only / fused for _, fused, input_only in split_backward_shares(plan, repeats)]
    first = min(shares) if first_stage_share is None else first_stage_share
    return [first, *shares]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", required=True, help="a measured training profile (hppctl profile's output)")
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, required=True)
    parser.add_argument("--strategies", default="asteroid,pp")
    parser.add_argument("--first-stage-share", type=float, default=None,
                        help="weight-gradient share assumed for stage 0 (default: the smallest measured)")
    parser.add_argument("--repeats", type=int, default=14, help="backward passes per stage and kind")
    args = parser.parse_args()
    profile = load(args.profile, Profile)
    request = PlanRequest(global_batch=args.global_batch, micro_batch=args.micro_batch)
    print(f"{'strategy':10} {'simulator':>10} {'1F1B':>8} {'W deferred':>11}  weight-gradient shares per stage")
    for strategy in args.strategies.split(","):
        plan = make_plan(profile, request, strategy)
        if any(len(s.devices) > 1 for s in plan.stages):
            print(f"{strategy:10} replicated stages: not modelled here")
            continue
        shares = measured_shares(plan, args.first_stage_share, args.repeats)
        simulated = args.global_batch / simulate_plan(plan, profile)[1].round_latency_s
        plain, split = replay(plan, profile, [0.0] * len(shares)), replay(plan, profile, shares)
        print(f"{strategy:10} {simulated:10.1f} {plain:8.1f} {split:11.1f}  {', '.join(f'{s:.0%}' for s in shares)}")


if __name__ == "__main__":
    main()
