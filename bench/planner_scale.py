"""Planner scale (issue 28 item 4): whole `hppctl plan` processes on large synthetic profiles.

    python bench/planner_scale.py                   # 1000 layers x 16 devices, then 2000 x 32
    python bench/planner_scale.py --sizes 1000x16   # one size
    python bench/planner_scale.py --code ../main    # time another checkout (before / after)

Each figure is one fresh process of the real CLI (`python -m hppctl plan`): interpreter start-up,
imports, loading and validating the profile, planning (default strategy `asteroid`) and writing
the plan. Wall time is measured around the subprocess, CPU time (user + system) from the child's
rusage. The profile is `hppctl.profiling.synthetic.synthetic_profile` with bench/plan_speed.py's
parameters (speeds 1-4, budgets 4 / 8 GB alternating, batch grid 1-64), written once to a
temporary directory (not timed, removed after). Each row prints the plan file's digest (without its
planning time): two checkouts that give the same plan print the same digest. Target: 1000 x 16 <= 10 s
whole process on the project's 2-core VM.
A bench, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_profile(path: Path, layers: int, devices: int) -> str:
    """The synthetic profile as `hppctl.store.save` writes it; if that is over the input file limit
    (2000 x 32 is 25.8 MB, the limit 16 MiB), compact JSON with timings to 6 significant digits."""
    sys.path.insert(0, str(ROOT))
    from hppctl.limits import MAX_FILE_BYTES
    from hppctl.profiling.synthetic import synthetic_profile
    from hppctl.store import save

    profile = synthetic_profile(layers, [1 + (i % 4) for i in range(devices)],
                                memory_bytes=[(4 + 4 * (i % 2)) * 10**9 for i in range(devices)],
                                grid=[1, 2, 4, 8, 16, 32, 64])
    save(path, profile)
    if path.stat().st_size <= MAX_FILE_BYTES:
        return "store.save"
    document = profile.model_dump(mode="json")
    for device in document["devices"]:
        for key in ("forward_s", "backward_s"):
            device[key] = [[float(f"{t:.6g}") for t in row] for row in device[key]]
    path.write_text(json.dumps(document, separators=(",", ":")))
    return "compact, 6 digits"


def plan_digest(path: Path) -> str:
    """The plan file's SHA-256 (first 12 hex digits) without its `planning_time_s`: equal digests, same
    plan, so side-by-side runs of two checkouts show they gave the same answer."""
    def without_time(x):
        if isinstance(x, dict):
            return {k: without_time(v) for k, v in x.items() if k != "planning_time_s"}
        return [without_time(v) for v in x] if isinstance(x, list) else x
    text = json.dumps(without_time(json.loads(path.read_text())), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def timed_plan(profile: Path, out: Path, strategy: str, code: Path) -> tuple[float, float, str]:
    """(wall s, CPU s, the plan's summary line) of one `hppctl plan` process."""
    argv = [sys.executable, "-m", "hppctl", "plan", "--profile", str(profile), "--global-batch", "1024",
            "--micro-batch", "64", "--strategy", strategy, "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(code))
    started = time.perf_counter()
    # cwd too: `python -m` puts the working directory first on sys.path
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, cwd=code)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    stdout, stderr = child.stdout.read(), child.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"hppctl plan failed: {stderr.strip()}")
    summary = next((line for line in stdout.splitlines() if line.startswith("predicted")), "")
    return wall, usage.ru_utime + usage.ru_stime, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000x16,2000x32", help="LAYERSxDEVICES, comma-separated")
    parser.add_argument("--strategy", default="asteroid")
    parser.add_argument("--code", type=Path, default=ROOT, help="the hppctl checkout to time (default: this one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hppctl-scale-") as tmp:
        run(args, Path(tmp))


def run(args: argparse.Namespace, tmp: Path) -> None:
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; strategy {args.strategy}, global batch 1024, micro-batch 64; code {args.code}")
    print(f"{'layers x devices':<17} {'profile MB':>10} {'written as':<17} {'wall s':>7} {'CPU s':>7}  {'plan digest':<12}  plan")
    for size in args.sizes.split(","):
        layers, devices = (int(x) for x in size.lower().split("x"))
        profile = tmp / f"synthetic-{layers}x{devices}.json"
        written = write_profile(profile, layers, devices)
        plan = tmp / f"plan-{layers}x{devices}.json"
        wall, cpu, summary = timed_plan(profile, plan, args.strategy, args.code)
        print(f"{size:<17} {profile.stat().st_size / 1e6:>10.1f} {written:<17} {wall:>7.2f} {cpu:>7.2f}  {plan_digest(plan):<12}  "
              f"{summary}", flush=True)


if __name__ == "__main__":
    main()
