"""How long a local run waits for its workers: forked from the zygote, against fresh `python -m`,
and forked from a zygote that did not trace the run's model first.

    python bench/local_start.py                  # 3 runs per mode, tiny-mlp on 3 local devices, 1 round
    python bench/local_start.py --runs 5 --rounds 8 --devices 4
    python bench/local_start.py --model mobilenetv2 --modes fork,cold

Each run is a separate Python process (so that each starts its own zygote, as one `hppctl run`
does) that times `Session.run` of a plan with one single-device stage per device (layers split
evenly, micro-batches of 4). Modes: `fork` (the default: workers forked from the zygote, which traced
the run's model first), `exec` (each worker a fresh `python -m`), `cold` (forked, but the zygote did
not trace the model: each worker traces it itself, as before 2026-11-27). Modes alternate run by run,
so a machine that slows down during the benchmark slows all. Printed per mode: wall seconds of the
whole process (interpreter and imports included), seconds from the session's start to its first
round, and CPU seconds of the process and the descendants it waited for (a zygote that ends when
the launcher does is not among them).
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
import hppctl.runtime.launch as launch
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.session import RunRequest, Session
from hppctl.zoo import layer_costs
from tests.runtime.factories import local_cluster, make_plan

if {cold}:
    launch.models_to_warm = lambda model: []  # the zygote does not trace the model: each worker does
devices = [f"d{{i}}" for i in range({devices})]
layers = len(layer_costs({model!r}, "fine"))
cuts = [round(layers * i / len(devices)) for i in range(len(devices) + 1)]
stages = [((a, b), [d], [4]) for (a, b), d in zip(zip(cuts, cuts[1:]), devices)]
plan = make_plan({model!r}, stages, global_batch=16, micro_batch=4)
options = TrainOptions(rounds={rounds}, threads=1, dataset="synthetic", lr=0.1)
begin = time.perf_counter()
first = []
Session(RunRequest(plan, local_cluster(*devices), options)).run(
    on_round=lambda row: first or first.append(time.perf_counter() - begin))
print(json.dumps({{"first_round_s": first[0], "session_s": time.perf_counter() - begin}}))
"""


MODES = {"fork": "fork", "exec": "exec", "cold": "fork"}
"""Each mode and the HPPCTL_LOCAL_START it runs with (`cold`: forked, the zygote not warmed)."""


def one_run(mode: str, model: str, devices: int, rounds: int) -> dict:
    code = ONE_RUN.format(repo=str(REPO), model=model, devices=devices, rounds=rounds, cold=mode == "cold")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "HPPCTL_LOCAL_START": MODES[mode]})
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
    parser.add_argument("--model", default="tiny-mlp", help="a built-in training model")
    parser.add_argument("--modes", default="fork,exec", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: {args.modes!r}: each of {', '.join(MODES)}")
    results: dict[str, list[dict]] = {mode: [] for mode in modes}
    for _ in range(args.runs):
        for mode in results:
            results[mode].append(one_run(mode, args.model, args.devices, args.rounds))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{args.model}, {args.devices} local devices, {args.rounds} round(s), {os.cpu_count()} cores, "
          f"median of {args.runs} runs (min-max)")
    print(f"{'mode':<6} {'wall s':>16} {'first round s':>16} {'CPU s':>16}")
    for mode, rows in results.items():
        cells = []
        for key in ("wall_s", "first_round_s", "cpu_s"):
            values = [r[key] for r in rows]
            cells.append(f"{statistics.median(values):6.2f} ({min(values):.1f}-{max(values):.1f})")
        print(f"{mode:<6} " + " ".join(f"{c:>16}" for c in cells))
    if "fork" in results:
        fork = statistics.median(r["wall_s"] for r in results["fork"])
        for other in set(results) - {"fork"}:
            print(f"{other} / fork wall: {statistics.median(r['wall_s'] for r in results[other]) / fork:.2f}x")


if __name__ == "__main__":
    main()
