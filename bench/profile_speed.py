"""`hppctl profile` on a 3-host edge lab, measured against issue 5's acceptance figures.

    python bench/profile_speed.py                       # builds the lab below (needs root), ~6-8 minutes
    python bench/profile_speed.py --cluster C.yaml      # a cluster that is already up (skips the sshd test)
    python bench/profile_speed.py --runs 1 --json
    python bench/profile_speed.py --quiet-load 99     # do not wait for a quiet machine

Default lab: hosts `fast`, `mid`, `slow` with CPU quotas 1.0, 0.5, 0.25 core, 1 GB each, 100 Mbit/s.
Everything runs as a user would run it: `hppctl profile` and `hppctl plan` as subprocesses, over
SSH with host-key checking, with an empty measurement cache ($HPPCTL_CACHE_DIR in a temp dir).
The lab's CPU quotas are caps: they hold only while the machine has the cores to give, so on a
shared machine each measurement first waits (up to --max-wait) for the load average to fall below
--quiet-load, and the output shows the load before and after each run.

Printed figures:
- time: wall seconds of each `hppctl profile` run of mobilenetv2 over batch sizes 1-64 on the three
  hosts (in parallel), links included; target 5 minutes;
- capacity: training samples/s of the whole model (sum of every layer's forward + backward, at
  each batch size) of each host relative to the 1-core host, against the quota ratio; target 20%;
- bandwidth: each direction's measured goodput against the configured rate; target 10%. (TCP/IP
  headers take ~4.4% of a 1500-byte frame: an exact shaper reads ~95.6%);
- layer sum vs step: the profile's per-layer sum at each batch size against (a) the whole training
  steps the probe timed in the same rounds (`train_step_s`), and (b) a whole training step measured
  independently, later: a separate plain-torch process per host (with the workers' steady heap,
  hppctl/allocator.py) that builds the model and times
  training steps (forward, loss, backward) back to back for a few seconds with the wall clock, all
  hosts at once as during profiling; target 15%;
- repeatability: for every layer time of at least 1 ms (per host, layer, direction, batch size),
  the difference between two runs relative to the smaller; target 10% on every one; beside it, the
  same two runs' whole training steps (`train_step_s`, run 2 / run 1), which bound it;
- noise floor: the CPU time of one fixed training step, repeated for a minute on this machine outside
  the lab, by 10-second window: how much the machine itself drifts (a shared VM's cores slow down
  and speed up with work that is not ours), a bound on any repeatability figure;
- failure: one host's sshd killed: exit code, the error line, the devices left in the profile;
- plan: `hppctl plan --compare` on the measured profile: exit code and the best strategy.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hppctl.models.cluster import ClusterSpec  # noqa: E402
from hppctl.models.profile import Profile  # noqa: E402
from hppctl.store import load  # noqa: E402
from hppctl.lab.network import free_subnet  # noqa: E402

LAB = """\
name: prof-bench
bandwidth: 100mbit
subnet: {subnet}
cpu_period: {period}
hosts:
  - {name: fast, cpu: 1.0, memory: 1GB}
  - {name: mid, cpu: 0.5, memory: 1GB}
  - {name: slow, cpu: 0.25, memory: 1GB}
"""
QUOTAS = {"fast": 1.0, "mid": 0.5, "slow": 0.25}

STEP_SCRIPT = """
import json, sys, time
from hppctl.allocator import steady_heap
steady_heap()  # as hppctl's workers (and its probe) run
import torch
torch.set_num_threads(1)
from hppctl.zoo import get_model
spec = get_model(sys.argv[1]); model = spec.build(); model.train()
out = {}
for b in [int(x) for x in sys.argv[2].split(",")]:
    x = spec.example_input(b); y = torch.randint(0, 10, (b,))
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in norms: m.train(b > 1)  # batch 1 with 1x1 maps: eval-mode BatchNorm, as the profiler does
    def step():
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
    step(); step()
    n, t, c = 0, time.perf_counter(), time.process_time()
    while n < 3 or time.perf_counter() - t < float(sys.argv[3]):
        step(); n += 1
    out[b] = (time.perf_counter() - t) / n
    out[f"cpu{b}"] = (time.process_time() - c) / n
print(json.dumps(out))
"""


NOISE_SCRIPT = """
import json, sys, time
import torch
torch.set_num_threads(1)
from hppctl.zoo import get_model
spec = get_model(sys.argv[1]); model = spec.build(); model.train()
x = spec.example_input(16); y = torch.randint(0, 10, (16,))
def step():
    model.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
step(); step()
samples, start = [], time.perf_counter()
while time.perf_counter() - start < float(sys.argv[2]):
    c = time.process_time(); step(); samples.append((time.perf_counter() - start, time.process_time() - c))
print(json.dumps(samples))
"""


def noise_floor(model: str, seconds: float) -> dict:
    """The machine's own drift: CPU seconds of one fixed training step (batch 16, one thread), repeated on
    this machine outside the lab for `seconds`; medians of 10-second windows, and their spread."""
    result = sh([sys.executable, "-c", NOISE_SCRIPT, model, str(seconds)])
    samples = json.loads(result.stdout.strip().splitlines()[-1])
    windows: dict[int, list[float]] = {}
    for t, cpu in samples:
        windows.setdefault(int(t // 10), []).append(cpu)
    medians = [statistics.median(v) for k, v in sorted(windows.items()) if len(v) >= 5]
    return {"steps": len(samples), "window_medians_s": medians,
            "spread": max(medians) / min(medians) - 1 if medians else 0.0}


def sh(argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, env=env)


def profile_run(cluster: Path, out: Path, model: str, grid: str, repeats: int, env: dict, force: bool = True):
    argv = ["hppctl", "profile", "--cluster", str(cluster), "--model", model, "--batch-sizes", grid,
            "--repeats", str(repeats), "--out", str(out), "--json"] + (["--force"] if force else [])
    start = time.perf_counter()
    result = sh(argv, env)
    return time.perf_counter() - start, result


def capacity(profile: Profile) -> dict[str, dict]:
    """Samples/s of one training pass (all layers forward + backward) per device and batch size, and
    overall: every batch size's samples over every batch size's time (one figure per device)."""
    report = {}
    for d in profile.devices:
        times = [sum(f[k] + bw[k] for f, bw in zip(d.forward_s, d.backward_s)) for k in range(len(d.batch_sizes))]
        report[d.name] = {**{b: b / t for b, t in zip(d.batch_sizes, times)},
                          "overall": sum(d.batch_sizes) / sum(times)}
    return report


def independent_steps(cluster: ClusterSpec, model: str, grid: str, seconds: float) -> dict[str, dict[int, float]]:
    """Whole training steps timed by a separate plain-torch process on every host at once."""
    from hppctl.profiling.remote import SshEndpoint

    script = STEP_SCRIPT.replace("'", "'\"'\"'")
    running = {}
    for device in cluster.devices:
        ep = SshEndpoint(device, cluster)
        command = f"cd /tmp && {ep.python} -c '{script}' {model} {grid} {seconds}"
        running[device.name] = (ep, ep.conn.run(command, hide=True, warn=True, asynchronous=True, in_stream=False))
    steps, cpu = {}, {}
    for name, (ep, promise) in running.items():
        result = promise.join()
        timed = json.loads(result.stdout.strip().splitlines()[-1])
        steps[name] = {int(k): v for k, v in timed.items() if not k.startswith("cpu")}
        cpu[name] = {int(k[3:]): v for k, v in timed.items() if k.startswith("cpu")}
        ep.close()
    return steps, cpu


def repeatability(a: Profile, b: Profile, raw: bool = False) -> dict[str, dict]:
    """|a - b| / min(a, b) over every layer time of at least 1 ms. `raw`: the probe's clock (CPU seconds on
    one thread) before the sustained factor, i.e. without what other processes took of the core."""
    report = {}
    for da, db in zip(a.devices, b.devices):
        diffs = []
        fa = da.measurement.sustained_factor if raw else [1.0] * len(da.batch_sizes)
        fb = db.measurement.sustained_factor if raw else [1.0] * len(db.batch_sizes)
        for field in ("forward_s", "backward_s"):
            for ra, rb in zip(getattr(da, field), getattr(db, field)):
                pairs = [(x / f, y / g) for x, y, f, g in zip(ra, rb, fa, fb)]
                diffs += [abs(x - y) / min(x, y) for x, y in pairs if min(x, y) >= 1e-3]
        report[da.name] = {"count": len(diffs), "over_10pct": sum(d > 0.10 for d in diffs),
                           "median": statistics.median(diffs) if diffs else 0.0,
                           "p90": sorted(diffs)[int(0.9 * (len(diffs) - 1))] if diffs else 0.0,
                           "max": max(diffs, default=0.0)}
    return report


def step_repeatability(a: Profile, b: Profile) -> dict[str, list[float]]:
    """Per host and batch size, run 2's whole training step (the probe's `train_step_s`) over run 1's:
    the same two runs without any per-layer split. A layer cannot repeat better than the step it is
    part of, so this bounds the per-layer figure from the side of the machine."""
    return {da.name: [y / x for x, y in zip(da.train_step_s, db.train_step_s)] for da, db in zip(a.devices, b.devices)}


def wait_for_quiet(threshold: float, max_wait_s: float) -> float:
    """Wait until the 1-minute load average is below `threshold` (other jobs on a shared machine take the
    cores the lab's quotas promise); returns the seconds waited. Gives up after `max_wait_s`."""
    start = time.monotonic()
    while os.getloadavg()[0] >= threshold and time.monotonic() - start < max_wait_s:
        time.sleep(5)
    return time.monotonic() - start


def kill_sshd(state_dir: Path, lab: str, host: str) -> None:
    state = json.loads((state_dir / lab / "state.json").read_text())
    [pid] = [h["sshd_pid"] for h in state["hosts"] if h["name"] == host]
    os.kill(pid, 15)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cluster", type=Path, help="use this cluster (already up) instead of building the lab")
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--runs", type=int, default=2, help="profile runs (2 for the repeatability figure)")
    p.add_argument("--step-seconds", type=float, default=4.0)
    p.add_argument("--quiet-load", type=float, default=1.5,
                   help="before each measurement, wait (up to --max-wait s) for the 1-minute load average to drop "
                        "below this: the lab's CPU quotas only hold while the machine has cores to give")
    p.add_argument("--max-wait", type=float, default=900.0)
    p.add_argument("--noise-seconds", type=float, default=60.0,
                   help="how long to time one fixed step on this machine for the noise floor (0: skip)")
    p.add_argument("--cpu-period", default="100ms",
                   help="the lab's CFS period (lab spec `cpu_period`; docs/lab.md: what it changes)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="profile-speed-"))
    env = {**os.environ, "HPPCTL_CACHE_DIR": str(work / "cache")}
    state_dir = work / "state"
    cluster_file = a.cluster
    if cluster_file is None:
        (work / "lab.yaml").write_text(LAB.replace("{subnet}", free_subnet(first=200)).replace("{period}", a.cpu_period))
        cluster_file = work / "cluster.yaml"
        up = sh(["hppctl", "lab", "up", "--spec", str(work / "lab.yaml"), "--out", str(cluster_file),
                 "--state-dir", str(state_dir)])
        if up.returncode != 0:
            print(up.stderr, file=sys.stderr)
            return up.returncode
    report: dict = {"model": a.model, "batch_sizes": a.batch_sizes, "repeats": a.repeats, "runs": [],
                    "cpu_period": a.cpu_period if a.cluster is None else None}
    try:
        cluster = load(cluster_file, ClusterSpec)
        profiles = []
        for r in range(a.runs):
            wait_for_quiet(a.quiet_load, a.max_wait)
            load_before = os.getloadavg()[0]
            seconds, result = profile_run(cluster_file, work / f"run{r}.json", a.model, a.batch_sizes, a.repeats, env)
            entry = {"seconds": seconds, "exit": result.returncode, "load_before": load_before,
                     "load_after": os.getloadavg()[0],
                     "error": result.stderr.strip().splitlines()[-1] if result.returncode else None}
            if result.returncode == 0:
                profiles.append(load(work / f"run{r}.json", Profile))
                entry["factors"] = {d.name: d.measurement.sustained_factor for d in profiles[-1].devices}
                entry["quota_measured"] = {d.name: d.measurement.cpu_quota_cores for d in profiles[-1].devices}
            report["runs"].append(entry)
        if not profiles:
            print(json.dumps(report, indent=2))
            return 1
        first = profiles[0]
        report["capacity"] = capacity(first)
        report["bandwidth"] = [{"between": l.between, "directed_bytes_per_s": l.directed_bytes_per_s,
                                "configured_bytes_per_s": cluster.bandwidth_between(*l.between), "rtt_s": l.rtt_s}
                               for l in first.links]
        wait_for_quiet(a.quiet_load, a.max_wait)
        report["steps"], report["steps_cpu"] = independent_steps(cluster, a.model, a.batch_sizes, a.step_seconds)
        report["layer_sum_cpu"] = {d.name: {b: sum(f[k] + bw[k] for f, bw in zip(d.forward_s, d.backward_s))
                                            / d.measurement.sustained_factor[k] for k, b in enumerate(d.batch_sizes)}
                                   for d in first.devices}
        report["layer_sum"] = {d.name: {b: sum(f[k] + bw[k] for f, bw in zip(d.forward_s, d.backward_s))
                                        for k, b in enumerate(d.batch_sizes)} for d in first.devices}
        report["profile_steps"] = {d.name: dict(zip(d.batch_sizes, d.train_step_s)) for d in first.devices}
        report["quota_measured"] = {d.name: d.measurement.cpu_quota_cores for d in first.devices}
        report["factors"] = {d.name: d.measurement.sustained_factor for d in first.devices}
        report["noise_floor"] = noise_floor(a.model, a.noise_seconds) if a.noise_seconds > 0 else None
        if len(profiles) > 1:
            report["repeatability"] = repeatability(profiles[0], profiles[1])
            report["repeatability_clock"] = repeatability(profiles[0], profiles[1], raw=True)
            report["step_repeatability"] = step_repeatability(profiles[0], profiles[1])
        plan = sh(["hppctl", "plan", "--profile", str(work / "run0.json"), "--global-batch", "256",
                   "--micro-batch", "32", "--compare", "--json"], env)
        rows = json.loads(plan.stdout) if plan.returncode == 0 else []
        report["plan"] = {"exit": plan.returncode, "best": rows[0]["strategy"] if rows else None,
                          "samples_per_s": rows[0]["simulated_throughput"] if rows else None}
        if a.cluster is None:
            kill_sshd(state_dir, "prof-bench", "slow")
            seconds, result = profile_run(cluster_file, work / "failed.json", a.model, a.batch_sizes, a.repeats,
                                          env, force=False)
            kept = load(work / "failed.json", Profile) if (work / "failed.json").exists() else None
            report["failure"] = {"exit": result.returncode, "seconds": seconds,
                                 "error": (result.stderr.strip().splitlines() or [""])[-1],
                                 "devices": [d.name for d in kept.devices] if kept else None,
                                 "missing": [m.name for m in kept.missing_devices] if kept else None}
    finally:
        if a.cluster is None:
            sh(["hppctl", "lab", "down", "--name", "prof-bench", "--state-dir", str(state_dir)])
    if a.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        render(report, cluster)
    return 0


def _cores(quota: float | None) -> str:
    """A measured quota; None where the device read as not limited (e.g. a cpuset of whole cores)."""
    return f"{quota:.3f}" if quota is not None else "none "


def render(r: dict, cluster: ClusterSpec) -> None:
    print(f"hppctl profile: {r['model']}, batch sizes {r['batch_sizes']}, {r['repeats']} repeats, "
          f"{len(cluster.devices)} hosts in parallel, links one pair at a time, empty cache"
          + (f"; lab CFS period {r['cpu_period']}" if r.get("cpu_period") else ""))
    for i, run in enumerate(r["runs"]):
        status = "ok" if run["exit"] == 0 else f"exit {run['exit']}: {run['error']}"
        print(f"  run {i + 1}: {run['seconds']:.1f} s ({run['seconds'] / 60:.2f} min; target 5 min)  {status}; "
              f"machine load average {run['load_before']:.1f} -> {run['load_after']:.1f}")
        for name, factors in run.get("factors", {}).items():
            print(f"      {name:<6} quota read {_cores(run['quota_measured'][name])}, sustained factor (wall/CPU) "
                  f"{min(factors):.2f}-{max(factors):.2f}")
    names = list(r["capacity"])
    ref = names[0]
    grid = sorted(b for b in r["capacity"][ref] if b != "overall")
    print(f"\ncapacity: samples/s of all layers' forward + backward, relative to {ref} (quota ratio in brackets)")
    print("  host   quota(measured)  overall (error)   " + "  ".join(f"b={b:<5}" for b in grid) + "  worst batch")
    for n in names:
        quota = QUOTAS.get(n)
        expected = quota / QUOTAS[ref] if quota and ref in QUOTAS else None
        ratios = [r["capacity"][n][b] / r["capacity"][ref][b] for b in grid]
        overall = r["capacity"][n]["overall"] / r["capacity"][ref]["overall"]
        error = f"{abs(overall / expected - 1):.1%}" if expected else "-"
        worst = f"{max(abs(x / expected - 1) for x in ratios):.1%}" if expected else "-"
        print(f"  {n:<6} {str(quota):<5}({_cores(r['quota_measured'][n])})   {overall:.3f} ({error:>5})    "
              + "  ".join(f"{x:<7.3f}" for x in ratios) + f"  {worst}")
    print("\nbandwidth (goodput, each direction) against the configured rate")
    for link in r["bandwidth"]:
        ab, ba = link["directed_bytes_per_s"]
        conf = link["configured_bytes_per_s"]
        print(f"  {link['between'][0]}->{link['between'][1]}: {ab * 8 / 1e6:.1f} Mbit/s ({ab / conf:.3f})   "
              f"{link['between'][1]}->{link['between'][0]}: {ba * 8 / 1e6:.1f} Mbit/s ({ba / conf:.3f})   "
              f"rtt {link['rtt_s'] * 1e3:.3f} ms")
    print("\nlayer sum vs the whole training steps the probe timed in the same rounds (train_step_s; ratio)")
    print("  host   " + "  ".join(f"b={b:<5}" for b in grid) + "  worst")
    for n in names:
        ratios = [r["layer_sum"][n][b] / r["profile_steps"][n][b] for b in grid]
        print(f"  {n:<6} " + "  ".join(f"{x:<7.3f}" for x in ratios) + f"  {max(abs(x - 1) for x in ratios):.1%}")
    print("\nlayer sum vs an independently measured whole training step (wall ms; ratio)")
    print("  host   " + "  ".join(f"b={b:<16}" for b in grid))
    for n in names:
        cells = []
        for b in grid:
            layers, step = r["layer_sum"][n][b], r["steps"][n][b]
            cells.append(f"{layers * 1e3:6.1f}/{step * 1e3:6.1f} {layers / step:.2f}")
        print(f"  {n:<6} " + "  ".join(cells))
    print("\nthe same in CPU time (the probe's CPU clock; the independent step's process_time), and the "
          "independent step's wall/CPU")
    print("  host   " + "  ".join(f"b={b:<16}" for b in grid))
    for n in names:
        cells = []
        for b in grid:
            layers, step, wall = r["layer_sum_cpu"][n][b], r["steps_cpu"][n][b], r["steps"][n][b]
            cells.append(f"{layers / step:.2f} (w/c {wall / step:.2f})")
        print(f"  {n:<6} " + "  ".join(f"{c:<18}" for c in cells))
    for key, title in (("repeatability", "profile times"),
                       ("repeatability_clock", "the probe's CPU clock, before the sustained factor")):
        if key not in r:
            continue
        print(f"\nrepeatability ({title}): layer times >= 1 ms, |run1 - run2| / smaller")
        for n, s in r[key].items():
            print(f"  {n:<6} {s['count']:4d} values, {s['over_10pct']:4d} over 10% "
                  f"({s['over_10pct'] / max(1, s['count']):.0%}); median {s['median']:.1%}, p90 {s['p90']:.1%}, "
                  f"max {s['max']:.1%}")
    if "step_repeatability" in r:
        print("\nrepeatability of the whole steps the probe timed (train_step_s, run 2 / run 1): a bound on the above")
        print("  host   " + "  ".join(f"b={b:<5}" for b in grid) + "  worst")
        for n, ratios in r["step_repeatability"].items():
            print(f"  {n:<6} " + "  ".join(f"{x:<7.3f}" for x in ratios)
                  + f"  {max(abs(max(x, 1 / x) - 1) for x in ratios):.1%}")
    if r.get("noise_floor"):
        nf = r["noise_floor"]
        print(f"\nnoise floor: one fixed training step (batch 16, one thread) on this machine, outside the lab: "
              f"CPU ms per 10 s window {', '.join(f'{m * 1e3:.0f}' for m in nf['window_medians_s'])} "
              f"(slowest/fastest - 1 = {nf['spread']:.1%})")
    print(f"\nplan --compare on the measured profile: exit {r['plan']['exit']}, best {r['plan']['best']} "
          f"({r['plan']['samples_per_s']:.1f} samples/s simulated)" if r['plan']['best'] else "")
    if "failure" in r:
        f = r["failure"]
        print(f"one host's sshd killed: exit {f['exit']} after {f['seconds']:.1f} s; profile holds {f['devices']}, "
              f"missing {f['missing']}\n  {f['error']}")


if __name__ == "__main__":
    sys.exit(main())
