"""Simulator speed: schedule generation + check + replay, and the whole `hppctl simulate` process.

    python bench/simulate_speed.py            # prints a table; figures recorded in docs/simulator.md

1. efficientnet-b1 (fine) on Env C: the asteroid plan from `hppctl profile` + `hppctl plan`
   (preset profile), global batch 2048, micro-batch 64 (M = 32). Target: <= 0.5 s in-process.
2. A synthetic 256-device, 1000-layer profile with a hand-built 45-stage plan (groups of 1 to 12
   devices, uneven allocations proportional to speed), M = 64. Target: <= 30 s.
Each in-process figure is the best of `--repeat` runs (default 3) of generate, check, simulate;
the process figure is one fresh `hppctl simulate --profile P --plan F --json` run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
HPPCTL = [sys.executable, "-m", "hppctl"]

from hppctl.models.plan import HppPlan, PlanRequest  # noqa: E402
from hppctl.models.profile import Profile  # noqa: E402
from hppctl.planner import cost_model, to_plan  # noqa: E402
from hppctl.planner.cost import StageChoice  # noqa: E402
from hppctl.planner.registry import Candidate  # noqa: E402
from hppctl.profiling.synthetic import synthetic_profile  # noqa: E402
from hppctl.schedule import ProfileTimings, check_schedule, schedule_for_plan, simulate  # noqa: E402
from hppctl.store import load, save  # noqa: E402


def timed_phases(plan: HppPlan, profile: Profile, repeat: int) -> dict[str, float]:
    best: dict[str, float] = {}
    for _ in range(repeat):
        t0 = time.perf_counter()
        schedule = schedule_for_plan(plan)
        t1 = time.perf_counter()
        check_schedule(schedule)
        t2 = time.perf_counter()
        result = simulate(schedule, ProfileTimings(profile, schedule))
        t3 = time.perf_counter()
        for key, value in (("generate", t1 - t0), ("check", t2 - t1), ("simulate", t3 - t2), ("total", t3 - t0)):
            best[key] = min(best.get(key, value), value)
    best["actions"] = sum(len(a) for a in schedule.actions.values())
    best["latency"] = result.round_latency_s
    return best


def env_c(tmp: Path) -> tuple[HppPlan, Profile, Path, Path]:
    profile_path, plan_path = tmp / "env-c-efficientnet-b1.json", tmp / "env-c.json"
    subprocess.run(HPPCTL + ["profile", "--cluster", str(ROOT / "profiles/env-c.yaml"), "--model", "efficientnet-b1",
                             "--granularity", "fine", "--out", str(profile_path)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(HPPCTL + ["plan", "--profile", str(profile_path), "--global-batch", "2048", "--micro-batch", "64",
                             "--out", str(plan_path)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return load(plan_path, HppPlan), load(profile_path, Profile), profile_path, plan_path


GROUPS = [4, 8, 2, 1, 12, 6, 3, 8, 4, 10]  # stage group sizes, cycled: 45 stages, 256 devices


def big(num_devices: int = 256, num_layers: int = 1000, micro_batch: int = 64, num_micro_batches: int = 64):
    speeds = [1.0 + (i % 4) for i in range(num_devices)]
    profile = synthetic_profile(num_layers, speeds, memory_bytes=[8 * 10**9] * num_devices, grid=[1, 4, 16, 64],
                                seed=1)
    request = PlanRequest(global_batch=micro_batch * num_micro_batches, micro_batch=micro_batch)
    cm = cost_model(profile, request)
    sizes, used = [], 0
    while used < num_devices:
        g = min(GROUPS[len(sizes) % len(GROUPS)], num_devices - used)
        sizes.append(g)
        used += g
    per = num_layers // len(sizes)
    stages, d = [], 0
    for p, g in enumerate(sizes):
        devices = tuple(range(d, d + g))
        d += g
        weights = [speeds[i] for i in devices]
        samples = [int(micro_batch * w / sum(weights)) for w in weights]
        samples[0] += micro_batch - sum(samples)
        end = num_layers if p == len(sizes) - 1 else (p + 1) * per
        stages.append(StageChoice(p * per, end, devices, tuple(samples)))
    plan = to_plan(cm, profile, request, "manual", Candidate(stages), 0.0)
    return plan, profile


def fresh_process(profile_path: Path, plan_path: Path) -> float:
    started = time.perf_counter()
    subprocess.run(HPPCTL + ["simulate", "--profile", str(profile_path), "--plan", str(plan_path), "--json"],
                   check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hppctl-simbench-"))
    rows = []
    plan, profile, profile_path, plan_path = env_c(tmp)
    rows.append(("Env C, efficientnet-b1 fine, asteroid plan", plan, timed_phases(plan, profile, args.repeat), 0.5,
                 fresh_process(profile_path, plan_path)))
    started = time.perf_counter()
    plan, profile = big()
    build_s = time.perf_counter() - started
    big_profile, big_plan = tmp / "big-profile.json", tmp / "big-plan.json"
    save(big_profile, profile)
    save(big_plan, plan)
    rows.append(("synthetic 256 devices x 1000 layers", plan, timed_phases(plan, profile, args.repeat), 30.0,
                 fresh_process(big_profile, big_plan)))
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}; best of {args.repeat}; "
          f"(building the synthetic profile and plan took {build_s:.1f} s, not counted)")
    print(f"{'case':<44} {'P':>3} {'dev':>4} {'M':>3} {'actions':>8} {'generate':>9} {'check':>7} {'simulate':>9} "
          f"{'total s':>8} {'target':>7}      {'process s':>9}")
    for case, plan, t, target, process in rows:
        devices = sum(len(s.devices) for s in plan.stages)
        print(f"{case:<44} {len(plan.stages):>3} {devices:>4} {plan.num_micro_batches:>3} {t['actions']:>8} "
              f"{t['generate']:>9.3f} {t['check']:>7.3f} {t['simulate']:>9.3f} {t['total']:>8.3f} "
              f"{'<= ' + str(target):>7} {'ok' if t['total'] <= target else 'SLOW':>4} {process:>9.2f}")


if __name__ == "__main__":
    main()
