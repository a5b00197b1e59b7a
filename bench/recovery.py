"""Recovery from a lost device on the edge lab's Env D, light against heavy re-planning, measured and simulated.

    sudo python bench/recovery.py                                  # every case, light and heavy (~15 min)
    sudo python bench/recovery.py --cases kill-single,link-cut --rounds 14 --out recovery.json
    sudo python bench/recovery.py --measured     # plan and simulate on `hppctl profile` of the lab

Env D of the Asteroid paper: 1 Jetson TX2 + 3 Jetson Nano at 100 Mbit/s, `mobilenetv2` (32x32,
fine layers), global batch 64, micro-batch 16, digits. The lab gives each host its preset's CPU
share and a 100 Mbit/s link; workers run over SSH inside the hosts' namespaces and cgroups. The
plan is the planner's on a preset profile of the lab's devices (four single-device stages); the
`kill-replica` case uses the same cuts with the two middle stages merged into one stage on
nano0+nano1. For each case the bench starts a fresh run under the embedded coordinator (heartbeat
1 s, timeout 3 s, probe 2 s, backups every round), hurts `--victim` (default nano1) once round
`--fail-after` is reported, and prints, for light and heavy re-planning side by side:

- detection: failure -> the loss is confirmed (the probe went unanswered);
- recovery: failure -> the first round completed on the new plan (the paper's definition);
- replan + move: confirmation -> first round (what the re-planning strategy itself costs);
- throughput before the failure and after recovery: median samples/s of the rounds before it, and
  of the rounds after the first one on the new plan; and the same plan without fault tolerance
  (plain `hppctl run`: no coordinator, snapshots or backups), measured once;
- backup wait: median seconds per round that the backup step held up a round (measured), beside
  the simulator's seconds of backup traffic on the busiest uplink;
- the simulator's prediction of the same (`hppctl simulate --fail`, hppctl/schedule/failure.py);
- where re-plan + move went: the workers' reconfiguration steps (stop, wait for the plan, gather
  and upload for heavy, new gloo group, layer moves, stage rebuild, first backup, replayed round).

Cases: kill-single (SIGKILL of a single-device stage's worker), kill-replica (SIGKILL of one device
of a replicated stage), sigstop (the worker frozen), link-cut (`ip link set eth0 down` in the host's
namespace; restored after the run), kill-two (SIGKILL of `--victim` and `--second-victim`, default
tx0, at the same moment: devices that fail together, dropped by one re-plan; not among the
defaults, `--cases kill-two`). For kill-two, detection is the failure -> the second loss confirmed.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hppctl.models.cluster import ClusterSpec, DeviceSpec  # noqa: E402
from hppctl.models.plan import PlanRequest  # noqa: E402
from hppctl.planner import make_plan  # noqa: E402
from hppctl.runtime.config import TrainOptions  # noqa: E402
from hppctl.planner.manual import manual_plan  # noqa: E402
from hppctl.runtime.ft_session import RecoveryOptions, FtSession  # noqa: E402
from hppctl.runtime.session import RunRequest  # noqa: E402
from hppctl.schedule.failure import simulate_failure  # noqa: E402
from hppctl.store import load  # noqa: E402

NAME = "bench-recovery"
PRESETS = {"tx0": "jetson-tx2", "nano0": "jetson-nano", "nano1": "jetson-nano", "nano2": "jetson-nano"}
SPEC = "name: {name}\nbandwidth: 100mbit\nsubnet: {subnet}\nhosts:\n" + "".join(
    f"  - {{{{name: {d}, preset: {p}}}}}\n" for d, p in PRESETS.items())
CASES = ("kill-single", "kill-replica", "sigstop", "link-cut")
"""The default cases; `kill-two` runs when asked for."""


def preset_profile(model: str):
    from hppctl.driver import model_layers
    from hppctl.profiling.from_presets import build_preset_profile

    cluster = ClusterSpec(name="env-d", devices=[DeviceSpec(name=d, preset=p) for d, p in PRESETS.items()])
    layers, parts = model_layers(model, "fine")
    return build_preset_profile(cluster, layers, model=model, granularity="fine", parts=parts)


def replica_plan(plan):
    """The planner's cuts with stages 1 and 2 merged into one stage on nano0 + nano1 (8 + 8 samples)."""
    s = plan.stages
    B = plan.micro_batch
    stages = [((s[0].start, s[0].end), s[0].devices, s[0].samples),
              ((s[1].start, s[2].end), [s[1].devices[0], s[2].devices[0]], [B // 2, B - B // 2]),
              *[((x.start, x.end), x.devices, x.samples) for x in s[3:]]]
    return manual_plan(plan.model, stages, global_batch=plan.global_batch, micro_batch=B)


# Each case as `hppctl lab fault` injects it (hppctl/lab/faults.py).
FAULTS = {"kill-single": "kill", "kill-replica": "kill", "sigstop": "stop", "link-cut": "link-down", "kill-two": "kill"}


def victims(case: str, args) -> list[str]:
    return [args.victim, args.second_victim] if case == "kill-two" else [args.victim]


def lab_fault(work: Path, hosts: list[str], action: str) -> None:
    """`hppctl lab fault HOST[,HOST] ACTION` on the bench's lab."""
    from hppctl.lab.faults import inject_together
    from hppctl.lab.manager import the_lab

    inject_together(the_lab(work / "state", NAME), hosts, action)


def measure(case: str, method: str, plan, profile, cluster, work: Path, args) -> dict:
    options = TrainOptions(rounds=args.rounds, dataset="digits", lr=0.05, timeout_s=300)
    recovery = RecoveryOptions(profile=profile, heartbeat_s=1.0, timeout_s=args.timeout, probe_s=2.0, replan=method)
    session = FtSession(RunRequest(plan, cluster, options), recovery)
    failed_at: list[float] = []

    def on_round(row: dict) -> None:
        if row["round"] == args.fail_after and not failed_at:
            failed_at.append(time.time())
            lab_fault(work, victims(case, args), FAULTS[case])

    try:
        result = session.run(on_round=on_round)
    finally:
        if case == "link-cut":
            lab_fault(work, victims(case, args), "link-up")
    by = {e["event"]: e for e in session.events}
    t0 = failed_at[0]
    resume = by["replanned"]["resume_round"]
    rows = result.rounds
    before = [r["samples_per_s"] for r in rows if 0 < r["round"] < args.fail_after]
    after = [r["samples_per_s"] for r in rows if r["round"] > max(resume, args.fail_after) + 1]
    return {
        "case": case, "requested": method, "method": by["replanned"]["method"],
        "detection_s": by["lost"]["at"] - t0, "recovery_s": by["resumed"]["at"] - t0,
        "replan_and_move_s": by["resumed"]["at"] - by["lost"]["at"], "replan_s": by["replanned"]["replan_s"],
        "resume_round": resume, "throughput_before": statistics.median(before) if before else None,
        "throughput_after": statistics.median(after) if after else None,
        "stages_after": by["replanned"]["stages"], "moved_bytes": by["replanned"].get("moved_bytes", 0),
        "phases": by["resumed"].get("phases", {}),
        "backup_s_median": statistics.median(r["backup_s"] for r in rows if 0 < r["round"] < args.fail_after),
    }


def without_fault_tolerance(plan, cluster, args) -> float:
    """Median samples/s of the same plan under plain `hppctl run` (no coordinator, no snapshots or
    backups): what fault tolerance costs per round."""
    from hppctl.runtime.session import Session

    options = TrainOptions(rounds=args.rounds, dataset="digits", lr=0.05, timeout_s=300)
    rows = Session(RunRequest(plan, cluster, options)).run().rounds
    return statistics.median(r["samples_per_s"] for r in rows if r["round"] > 0)


def predicted(plan, profile, victim: str | list[str], method: str, timeout: float, case: str) -> dict:
    kind = "crash" if FAULTS[case] == "kill" else "silent"  # a killed worker's end is seen at once
    sim = simulate_failure(plan, profile, victim, 30.0, method=method, timeout_s=timeout, probe_s=2.0, kind=kind)
    return {"detection_s": sim.detection_s, "recovery_s": sim.recovery_s, "throughput_after": sim.throughput_after,
            "throughput_before": sim.throughput_before, "backup_link_s": sim.backup_link_s_before,
            "replan_and_move_s": sim.first_round_done_at_s - sim.detected_at_s}


def measured_profile(work: Path, args):
    """`hppctl profile` of the lab's hosts (batch sizes up to the micro-batch), as a user would run it."""
    from hppctl.models.profile import Profile

    grid = ",".join(str(2 ** i) for i in range(args.micro_batch.bit_length()) if 2 ** i <= args.micro_batch)
    out = work / "profile.json"
    began = time.time()
    subprocess.run([sys.executable, "-m", "hppctl", "profile", "--cluster", str(work / "cluster.yaml"),
                    "--model", args.model, "--batch-sizes", grid, "--out", str(out)], check=True,
                   env={**os.environ, "HPPCTL_CACHE_DIR": str(work / "cache")})
    print(f"profiled the lab in {time.time() - began:.0f} s: {out}", flush=True)
    return load(out, Profile)


def lab_up(work: Path) -> ClusterSpec:
    from hppctl.cli import run
    from hppctl.lab.network import free_subnet

    (work / "lab.yaml").write_text(SPEC.format(name=NAME, subnet=free_subnet()))
    run(["lab", "down", "--name", NAME, "--state-dir", str(work / "state")])
    if run(["lab", "up", "--spec", str(work / "lab.yaml"), "--out", str(work / "cluster.yaml"),
            "--state-dir", str(work / "state")]) != 0:
        raise SystemExit("lab up failed (root, tools, cgroups?)")
    return load(work / "cluster.yaml", ClusterSpec)


def fmt(value, unit="") -> str:
    return "-" if value is None else f"{value:.2f}{unit}" if isinstance(value, float) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--methods", default="light,heavy")
    parser.add_argument("--model", default="mobilenetv2")
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=14)
    parser.add_argument("--fail-after", type=int, default=4)
    parser.add_argument("--victim", default="nano1")
    parser.add_argument("--second-victim", default="tx0",
                        help="kill-two's other device (not --victim's backup holder, nor one backing up to it)")
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--measured", action="store_true",
                        help="plan, re-plan and simulate on `hppctl profile` of the lab itself instead of the presets")
    parser.add_argument("--out", help="also write the results as JSON")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    cluster = lab_up(work)
    results = []
    try:
        profile = measured_profile(work, args) if args.measured else preset_profile(args.model)
        plan = make_plan(profile, PlanRequest(global_batch=args.global_batch, micro_batch=args.micro_batch))
        print("plan:", " | ".join(f"[{s.start}, {s.end}) {','.join(s.devices)}" for s in plan.stages), flush=True)
        plain = without_fault_tolerance(plan, cluster, args)
        plain_sim = simulate_failure(plan, profile, args.victim, 30.0, replicate_every=0).throughput_before
        print(f"without fault tolerance: {plain:.1f} samples/s (simulated {plain_sim:.1f})", flush=True)
        for case in args.cases.split(","):
            case_plan = replica_plan(plan) if case == "kill-replica" else plan
            for method in args.methods.split(","):
                measured = measure(case, method, case_plan, profile, cluster, work, args)
                measured["predicted"] = predicted(case_plan, profile, victims(case, args), method, args.timeout, case)
                results.append(measured)
                print(json.dumps(measured), flush=True)
    finally:
        from hppctl.cli import run

        run(["lab", "down", "--name", NAME, "--state-dir", str(work / "state")])
    print(f"\nEnv D lab, {args.model}, G={args.global_batch}, B={args.micro_batch}, victim {args.victim}, "
          f"timeout {args.timeout} s + probe 2 s; measured (simulated)")
    print(f"the same plan without fault tolerance: {plain:.1f} samples/s (simulated {plain_sim:.1f})")
    header = (f"{'case':13} {'method':6} {'detect s':>14} {'recovery s':>14} {'replan+move s':>14} "
              f"{'thr before':>16} {'thr after':>16} {'backup wait (link)':>18}")
    print(header)
    for r in results:
        p = r["predicted"]
        print(f"{r['case']:13} {r['method']:6} {fmt(r['detection_s']):>6} ({fmt(p['detection_s']):>5}) "
              f"{fmt(r['recovery_s']):>6} ({fmt(p['recovery_s']):>5}) {fmt(r['replan_and_move_s']):>6} "
              f"({fmt(p['replan_and_move_s']):>5}) {fmt(r['throughput_before']):>7} ({fmt(p['throughput_before']):>6}) "
              f"{fmt(r['throughput_after']):>7} ({fmt(p['throughput_after']):>6}) "
              f"{fmt(r['backup_s_median']):>6} ({fmt(p['backup_link_s']):>5})")
    print("\nwhere re-plan + move went (s; per step the slowest device; wait_plan includes the coordinator's re-plan):")
    for r in results:
        print(f"{r['case']:13} {r['method']:6} " + ", ".join(f"{k} {v:.2f}" for k, v in r["phases"].items())
              + f"; replan {r['replan_s']:.3f}")
    for case in dict.fromkeys(r["case"] for r in results):
        pair = {r["requested"]: r for r in results if r["case"] == case}
        if {"light", "heavy"} <= set(pair):
            light, heavy = pair["light"], pair["heavy"]
            speed = heavy["recovery_s"] / light["recovery_s"]
            move = heavy["replan_and_move_s"] / light["replan_and_move_s"]
            thr = (light["throughput_after"] / heavy["throughput_after"]
                   if light["throughput_after"] and heavy["throughput_after"] else None)
            print(f"{case}: light recovers {speed:.2f}x faster than heavy ({move:.2f}x on re-plan + move), "
                  f"throughput after {fmt(thr)} of heavy's")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
