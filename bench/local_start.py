"""How long a local run waits for its workers: forked from the zygote, against fresh `python -m`.

    python bench/local_start.py                  # 3 runs per mode, tiny-mlp on 3 local devices, 1 round
    python bench/local_start.py --runs 5 --rounds 8 --devices 4

Each run is a separate Python process (so that each starts its own zygote, as one `hppctl run`
does) that times `Session.run` of a tiny-mlp plan with one single-device stage per device. Modes
alternate run by run, so a machine that slows down during the benchmark slows both. Printed per
mode: wall seconds of the whole process (interpreter and imports included), seconds from the
session's start to its first round, and CPU seconds of the process and all its descendants.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

ONE_RUN = r"""
import json, sys, time
started = time.perf_counter()
sys.path.insert(0, {repo!r})
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.session import RunRequest, Session
from tests.runtime.factories import local_cluster, make_plan

devices = [f"d{{i}}" for i in range({devices})]
cuts = [round(5 * i / len(devices)) for i in range(len(devices) + 1)]
stages = [((a, b), [d], [4]) for (a, b), d in zip(zip(cuts, cuts[1:]), devices)]
plan = make_plan("tiny-mlp", stages, global_batch=16, micro_batch=4)
options = TrainOptions(rounds={rounds}, threads=1, dataset="synthetic", lr=0.1)
begin = time.perf_counter()
first = []
Session(RunRequest(plan, local_cluster(*devices), options)).run(
    on_round=lambda row: first or first.append(time.perf_counter() - begin))
print(json.dumps({{"first_round_s": first[0], "session_s": time.perf_counter() - begin}}))
"""


def one_run(mode: str, devices: int, rounds: int) -> dict:
    code = ONE_RUN.format(repo=str(REPO), devices=devices, rounds=rounds)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "HPPCTL_LOCAL_START": mode})
    wall = time.perf_counter() - started
    if out.returncode != 0:
        sys.exit(f"{mode} run failed:\n{out.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, **json.loads(out.stdout.splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--devices", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"fork": [], "exec": []}
    for _ in range(args.runs):
        for mode in results:
            results[mode].append(one_run(mode, args.devices, args.rounds))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"tiny-mlp, {args.devices} local devices, {args.rounds} round(s), {os.cpu_count()} cores, "
          f"median of {args.runs} runs (min-max)")
    print(f"{'mode':<6} {'wall s':>16} {'first round s':>16} {'CPU s':>16}")
    for mode, rows in results.items():
        cells = []
        for key in ("wall_s", "first_round_s", "cpu_s"):
            values = [r[key] for r in rows]
            cells.append(f"{statistics.median(values):6.2f} ({min(values):.1f}-{max(values):.1f})")
        print(f"{mode:<6} " + " ".join(f"{c:>16}" for c in cells))
    fork, exec_ = (statistics.median(r["wall_s"] for r in results[m]) for m in ("fork", "exec"))
    print(f"exec / fork wall: {exec_ / fork:.2f}x")


if __name__ == "__main__":
    main()
