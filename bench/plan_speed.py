"""Planner speed: the whole `hppctl plan` process, as a user runs it.

    python bench/plan_speed.py            # prints a table; figures recorded in docs/planner.md

1. efficientnet-b1 at `fine` granularity on Env C (paper Table 7: 480 s on a Jetson NX),
   for `asteroid` and `asteroid-paper`. Target: <= 3 s per process (aim 1 s).
2. A synthetic 1000-layer x 16-device profile. Target: <= 60 s.
Each figure is the wall time of a fresh `hppctl plan` process (start-up, profile load, plan, write).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HPPCTL = [sys.executable, "-m", "hppctl"]


def timed(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(HPPCTL + args, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="hppctl-bench-"))
    profile = tmp / "env-c-efficientnet-b1.json"
    subprocess.run(HPPCTL + ["profile", "--cluster", str(ROOT / "profiles/env-c.yaml"), "--model", "efficientnet-b1",
                             "--granularity", "fine", "--out", str(profile)], check=True, stderr=subprocess.DEVNULL)
    sys.path.insert(0, str(ROOT))
    from hppctl.models.profile import Profile
    from hppctl.profiling.synthetic import synthetic_profile
    from hppctl.store import load, save

    layers = len(load(profile, Profile).layers)
    big = tmp / "synthetic-1000x16.json"
    save(big, synthetic_profile(1000, [1 + (i % 4) for i in range(16)],
                                memory_bytes=[(4 + 4 * (i % 2)) * 10**9 for i in range(16)], grid=[1, 2, 4, 8, 16, 32, 64]))
    rows = []
    for strategy in ("asteroid", "asteroid-paper"):
        args = ["plan", "--profile", str(profile), "--global-batch", "2048", "--micro-batch", "64",
                "--strategy", strategy, "--out", str(tmp / f"{strategy}.json")]
        rows.append((f"efficientnet-b1 fine ({layers} layers), Env C (6 devices)", strategy, timed(args), 3.0))
    for strategy in ("asteroid-paper", "asteroid"):
        args = ["plan", "--profile", str(big), "--global-batch", "1024", "--micro-batch", "64",
                "--strategy", strategy, "--out", str(tmp / f"big-{strategy}.json")]
        rows.append(("synthetic 1000 layers x 16 devices", strategy, timed(args), 60.0))
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}")
    print(f"{'case':<55} {'strategy':<16} {'seconds':>8} {'target':>7}")
    for case, strategy, seconds, target in rows:
        print(f"{case:<55} {strategy:<16} {seconds:>8.2f} {'<= ' + str(target):>7} {'ok' if seconds <= target else 'SLOW'}")


if __name__ == "__main__":
    main()
