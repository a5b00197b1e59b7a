"""What one `python -m hppctl run` costs the machine, for two source trees side by side.

    python bench/cli_start.py --trees new=/work/main,old=/tmp/old-checkout --model tiny-cnn --runs 6

Each run is `python -m hppctl run` (with PYTHONPATH set to the tree) of a plan with one single-device
stage per local device (layers split evenly, micro-batches of 4, global batch 16), 2 rounds of
synthetic data, one thread per worker; the trees alternate run by run, so a machine that slows down
slows both. Printed per tree: the command's wall seconds and the whole machine's CPU seconds from
/proc/stat over the run and the second after it (the zygote and workers end with the launcher; they
are not the command's waited-for descendants, so its own rusage would miss them). Nothing else should
run meanwhile: the CPU figure is the machine's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def machine_busy_s() -> float:
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def write_files(where: Path, model: str, devices: int) -> tuple[Path, Path]:
    sys.path.insert(0, str(REPO))
    from hppctl.store import save
    from hppctl.zoo import layer_costs
    from tests.runtime.factories import local_cluster, make_plan

    names = [f"d{i}" for i in range(devices)]
    layers = len(layer_costs(model, "fine"))
    cuts = [round(layers * i / devices) for i in range(devices + 1)]
    plan = make_plan(model, [((a, b), [d], [4]) for (a, b), d in zip(zip(cuts, cuts[1:]), names)],
                     global_batch=16, micro_batch=4)
    save(where / "plan.yaml", plan)
    save(where / "cluster.yaml", local_cluster(*names))
    return where / "plan.yaml", where / "cluster.yaml"


def one_run(tree: str, plan: Path, cluster: Path) -> tuple[float, float]:
    busy, begin = machine_busy_s(), time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hppctl", "run", "--plan", plan, "--cluster", cluster, "--dataset",
                           "synthetic", "--rounds", "2", "--threads", "1"], cwd=tempfile.gettempdir(),
                          env={**os.environ, "PYTHONPATH": tree}, capture_output=True, text=True)
    wall = time.perf_counter() - begin
    time.sleep(1.0)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return wall, machine_busy_s() - busy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", required=True, help="name=directory,name=directory")
    parser.add_argument("--model", default="tiny-cnn")
    parser.add_argument("--devices", type=int, default=3)
    parser.add_argument("--runs", type=int, default=6)
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.trees.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        plan, cluster = write_files(Path(tmp), args.model, args.devices)
        walls: dict[str, list[float]] = {name: [] for name in trees}
        cpus: dict[str, list[float]] = {name: [] for name in trees}
        for i in range(args.runs):
            for name in (list(trees) if i % 2 == 0 else list(reversed(trees))):
                wall, cpu = one_run(trees[name], plan, cluster)
                walls[name].append(wall)
                cpus[name].append(cpu)
                print(f"run {i} {name}: wall {wall:.2f} s, machine CPU {cpu:.2f} s", flush=True)
    print(f"{args.model} on {args.devices} local devices, {args.runs} runs per tree (medians, min-max):")
    for name in trees:
        w, c = walls[name], cpus[name]
        print(f"  {name:6s} wall {statistics.median(w):5.2f} s ({min(w):.2f}-{max(w):.2f})   "
              f"machine CPU {statistics.median(c):5.2f} s ({min(c):.2f}-{max(c):.2f})")


if __name__ == "__main__":
    main()
