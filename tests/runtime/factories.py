"""Small readable plans and clusters for runtime tests (made by hand, not by the planner)."""

from __future__ import annotations

from hppctl.models.cluster import ClusterSpec, DeviceSpec
from hppctl.models.plan import HppPlan, Prediction, StagePlan, TransferPlan
from hppctl.planner.cost import WARMUP_POLICIES


def make_plan(model: str, stages: list[tuple[tuple[int, int], list[str], list[int]]], *, global_batch: int,
              micro_batch: int, granularity: str = "fine", schedule: str = "1f1b-asteroid") -> HppPlan:
    """`stages`: ((start, end), devices, samples per device) from head to tail."""
    M, P = global_batch // micro_batch, len(stages)
    warmup = WARMUP_POLICIES[schedule]
    return HppPlan(
        strategy="manual", model=model, granularity=granularity, profile_digest="sha256:manual",
        global_batch=global_batch, micro_batch=micro_batch, num_micro_batches=M, schedule=schedule,
        stages=[StagePlan(layers=list(layers), devices=list(devices), samples=list(samples),
                          warmup=warmup(P, p, M), forward_s=1.0, backward_s=2.0, allreduce_s=0.0,
                          memory_bytes=[0] * len(devices), memory_budget_bytes=[10**9] * len(devices))
                for p, (layers, devices, samples) in enumerate(stages)],
        transfers=[TransferPlan(after_stage=p, bytes_per_micro_batch=0, forward_s=0.1, backward_s=0.1)
                   for p in range(P - 1)],
        prediction=Prediction(round_latency_s=1.0, throughput_samples_per_s=1.0, dominant_step=0, peak_memory_ratio=0.1),
    )


def local_cluster(*names: str) -> ClusterSpec:
    return ClusterSpec(name="local", devices=[DeviceSpec(name=n, local=True) for n in names])


def start_endless_two_device_run(where, *flags, stderr=None, replicated=False):
    """`python -m hppctl run` of tiny-mlp on two local devices (a: layers 0-2, b: 2-5; `replicated`:
    one stage of every layer on both, two samples each) for 100000 rounds of digits, one thread
    each, `--metrics` to `where/m.jsonl`: a run to disturb while it trains. Returns (the launcher
    process, the metrics path); stdout is discarded, stderr as given."""
    import subprocess
    import sys

    from hppctl.store import save

    stages = [((0, 5), ["a", "b"], [2, 2])] if replicated else [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])]
    save(where / "plan.yaml", make_plan("tiny-mlp", stages, global_batch=8, micro_batch=4))
    save(where / "cluster.yaml", local_cluster("a", "b"))
    metrics = where / "m.jsonl"
    launcher = subprocess.Popen([sys.executable, "-m", "hppctl", "run", "--plan", where / "plan.yaml", "--cluster",
                                 where / "cluster.yaml", "--dataset", "digits", "--rounds", "100000", "--threads", "1",
                                 "--metrics", metrics, *map(str, flags)],
                                stdout=subprocess.DEVNULL, stderr=stderr if stderr is not None else subprocess.DEVNULL,
                                text=True)
    return launcher, metrics


def hppctl_watching_its_zygote(*argv, timeout: float, env: dict | None = None, cwd=None):
    """`python -m hppctl *argv` to its end: (the CompletedProcess, whether the zygote of its local workers
    was a fork of it). A fork keeps the command's own command line; a fresh zygote runs
    `-c <hppctl.runtime.zygote's code>`. None when the command ended before its zygote was seen."""
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "hppctl", *map(str, argv)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    try:
        zygote, own = zygote_command_line(process)
        out, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    forked = None if zygote is None else zygote == own
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), forked


def zygote_command_line(process: subprocess.Popen) -> tuple[bytes | None, bytes | None]:
    """(command line of the child of `process` that has children of its own — the zygote and its
    forked workers —, `process`'s own command line), read together while it runs; (None, None) if
    it ended first."""
    import time
    from pathlib import Path

    from tests.recovery.factories import children

    while process.poll() is None:
        try:
            own = Path(f"/proc/{process.pid}/cmdline").read_bytes()
            for pid in children(process.pid):
                if children(pid):
                    return Path(f"/proc/{pid}/cmdline").read_bytes(), own
        except OSError:  # a process ended between the listing and the read
            pass
        time.sleep(0.05)
    return None, None
