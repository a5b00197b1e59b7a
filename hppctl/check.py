"""`hppctl check`: a pass/fail smoke test of this installation and of a cluster (docs/runtime.md, "`hppctl check`").

    report = run_check(cluster, source="cluster.yaml", timeout_s=60, on_step=print)   # CheckReport

Four steps, each a `Step` (ok or failed, what was checked, how long it took), stopping at the first
that fails:

1. install: this interpreter, torch within the range hppctl's package metadata allows, gloo, hppctl;
2. cluster: the cluster file, already loaded by the caller (its errors are bad input, exit 2);
3. devices: every `host:` device over SSH, the launcher's way (`hppctl.ssh`, host-key checking
   on, `ssh_start_failure`'s one-line classification): its `python:` runs and imports the same hppctl
   version as this one; `local:` devices run this interpreter;
4. train: a tiny model trained for a few rounds across every device of the cluster through the real
   runtime (`Session`, as `hppctl run` does: one worker per device, gloo, SSH for host devices); its
   training loss must fall below `LEARNED_RATIO` of the first rounds'.

The training is deterministic (fixed seed and sample order, Adam): the same layout learns the same
way on any machine, so a loss that does not fall means a broken runtime, not bad luck.
"""

from __future__ import annotations

import math
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable

from hppctl import __version__
from hppctl.errors import BadInput, HppctlError, RuntimeFailure
from hppctl.models.cluster import ClusterSpec, DeviceSpec

MODEL = "tiny-mlp"
"""6.9 k parameters, 5 layers: cheap enough that worker start-up is the whole cost of the training step."""
GRANULARITY = "fine"
DATASET = "digits"
"""scikit-learn's digits (a dependency of hppctl, so present wherever hppctl is): easy to learn, so that
a dozen rounds bring the loss down by far more than the pass mark."""
ROUNDS = 12
MICRO_BATCHES = 4
MIN_SAMPLES_PER_MICRO_BATCH = 32
OPTIMIZER, LR = "adam", 0.02
LEARNED_RATIO = 0.5
"""Pass when the mean loss of the last two rounds is below this fraction of the first two rounds' mean
(3 local workers: 2.27 -> 0.56, a ratio of 0.25)."""
VERSION_PROBE = "import sys, hppctl; print(hppctl.__version__, sys.version.split()[0])"


@dataclass
class Step:
    name: str
    ok: bool
    detail: str
    seconds: float
    exit_code: int = 0
    """What the run exits with when this step failed (1 runtime failure, 2 bad input)."""


@dataclass
class CheckReport:
    steps: list[Step] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def passed(self) -> bool:
        return all(s.ok for s in self.steps)

    @property
    def failed_step(self) -> Step | None:
        return next((s for s in self.steps if not s.ok), None)

    @property
    def exit_code(self) -> int:
        failed = self.failed_step
        return 0 if failed is None else failed.exit_code or 1

    def verdict(self) -> str:
        failed = self.failed_step
        if failed is None:
            return f"check passed in {self.wall_s:.1f} s"
        return f"check FAILED: {failed.detail}"

    def document(self) -> dict:
        return {"passed": self.passed, "exit_code": self.exit_code, "verdict": self.verdict(),
                "wall_s": self.wall_s, "steps": [asdict(s) for s in self.steps]}


class StepFailed(HppctlError):
    """A step's failure: its one-line detail and the exit code of the error behind it."""

    def __init__(self, detail: str, exit_code: int = 1) -> None:
        super().__init__(detail)
        self.exit_code = exit_code


# --- the cluster ----------------------------------------------------------------------------------
def refuse_presets(cluster: ClusterSpec, source: str) -> None:
    """A `preset:` device is a model of a device, not a machine: nothing to reach or train on."""
    presets = [d.name for d in cluster.devices if d.preset is not None]
    if presets:
        raise BadInput(f"{source}: devices: {', '.join(presets)}: preset devices are modelled, not real machines; "
                       f"hppctl check needs `local: true` or `host:` devices")


def local_cluster(count: int = 3) -> ClusterSpec:
    """What `hppctl check` checks without --cluster: three local worker processes, as `hppctl demo` runs."""
    return ClusterSpec(name="check", devices=[DeviceSpec(name=f"check{i}", local=True) for i in range(count)])


def describe_cluster(cluster: ClusterSpec) -> str:
    hosts = [d for d in cluster.devices if d.host is not None]
    local = len(cluster.devices) - len(hosts)
    kinds = [f"{local} local"] * bool(local) + [f"{len(hosts)} over SSH"] * bool(hosts)
    return f"{len(cluster.devices)} devices ({', '.join(kinds)}): {', '.join(d.name for d in cluster.devices)}"


# --- step 1: the installation ---------------------------------------------------------------------
def check_install() -> str:
    import torch
    import torch.distributed as dist

    allowed = torch_requirement()
    installed = torch.__version__.split("+")[0]
    if allowed is not None and not allowed.contains(installed, prereleases=True):
        raise StepFailed(f"install: torch {torch.__version__} is outside the supported range torch{allowed}")
    if not (dist.is_available() and dist.is_gloo_available()):
        raise StepFailed(f"install: torch {torch.__version__} has no gloo backend (torch.distributed), which the runtime needs")
    supported = f" (supported {allowed})" if allowed is not None else ""
    return (f"python {sys.version.split()[0]}, torch {torch.__version__}{supported}, gloo available, "
            f"hppctl {__version__}")


def torch_requirement():
    """The torch versions hppctl's own package metadata allows (pyproject.toml), or None when hppctl
    runs from a source tree that was never installed."""
    import importlib.metadata

    from packaging.requirements import Requirement  # installed with transformers, which hppctl requires

    try:
        requires = importlib.metadata.requires("hppctl") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for line in requires:
        requirement = Requirement(line)
        if requirement.name == "torch":
            return requirement.specifier
    return None


# --- step 3: the devices --------------------------------------------------------------------------
def check_devices(cluster: ClusterSpec, timeout_s: float) -> str:
    """Every SSH device reachable, its Python running hppctl of this version; all at once (threads),
    so that an unreachable device costs one connect timeout, not one per device."""
    hosts = [d for d in cluster.devices if d.host is not None]
    local = [d.name for d in cluster.devices if d.local]
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(hosts)))) as pool:
        answers = list(pool.map(lambda d: _probe_device(d, cluster, timeout_s), hosts))
    failures = [a for a in answers if isinstance(a, StepFailed)]
    if failures:
        raise StepFailed("; ".join(str(f) for f in failures), failures[0].exit_code)
    parts = [f"{d.name} ({d.host}): python {python}" for d, (_, python) in zip(hosts, answers)]
    if local:
        parts.append(f"{', '.join(local)}: local, this interpreter")
    return f"hppctl {__version__} on " + "; ".join(parts)


def _probe_device(device: DeviceSpec, cluster: ClusterSpec, timeout_s: float):
    """(hppctl version, python version) on the device, or the StepFailed naming it."""
    from hppctl.ssh import connect
    from hppctl.runtime.launch import ssh_start_failure

    python = device.python or "python3"
    try:
        with connect(cluster, device.name) as conn:
            conn.open()
            result = conn.run(shlex.join([python, "-c", VERSION_PROBE]), hide=True, warn=True, in_stream=False,
                              timeout=timeout_s)
    except Exception as e:  # noqa: BLE001 - paramiko and fabric fail in many classes; the launcher names each
        error = ssh_start_failure(e, device, cluster)
        return StepFailed(str(error), error.exit_code)  # it names the device and its address
    if result.exited != 0:
        last = (result.stderr.strip().splitlines() or [f"exit {result.exited}"])[-1]
        return StepFailed(f"device {device.name!r} ({device.host}): {python} cannot import hppctl there: {last[:200]}")
    words = result.stdout.split()
    theirs = words[0] if words else "nothing"
    if theirs != __version__:
        return StepFailed(f"device {device.name!r} ({device.host}): hppctl {theirs} there, {__version__} here: "
                          f"install the same version")
    return theirs, words[1] if len(words) > 1 else "?"


# --- step 4: the training -------------------------------------------------------------------------
def check_plan(cluster: ClusterSpec):
    """A plan of `MODEL` that uses every device: two stages (pipeline transfers) of about half the
    devices each (all-reduce within a stage of two or more), one stage for a one-device cluster.
    Made with the planner's cost model over nominal timings, so its predictions are well formed; no
    measuring, the smoke test checks that training works, not how fast."""
    from hppctl.models.plan import PlanRequest
    from hppctl.planner import cost_model, to_plan
    from hppctl.planner.cost import StageChoice
    from hppctl.planner.registry import Candidate

    profile = nominal_profile(cluster)
    n, layers = len(cluster.devices), len(profile.layers)
    groups = [list(range(n))] if n == 1 else [list(range(math.ceil(n / 2))), list(range(math.ceil(n / 2), n))]
    micro = max(MIN_SAMPLES_PER_MICRO_BATCH, max(len(g) for g in groups))
    cuts = [0, layers] if len(groups) == 1 else [0, layers // 2, layers]
    stages = [StageChoice(start=cuts[p], end=cuts[p + 1], devices=tuple(g), samples=tuple(_split(micro, len(g))))
              for p, g in enumerate(groups)]
    request = PlanRequest(global_batch=micro * MICRO_BATCHES, micro_batch=micro)
    return to_plan(cost_model(profile, request), profile, request, "check", Candidate(stages=stages), 0.0)


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def nominal_profile(cluster: ClusterSpec):
    """`MODEL`'s real layer costs with every device timed at a nominal 1 GFLOP/s (source: synthetic)."""
    from hppctl.models.profile import DeviceProfile, Profile
    from hppctl.zoo import layer_costs

    layers = layer_costs(MODEL, GRANULARITY)
    grid = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    forward = [[layer.forward_flops_per_sample * b / 1e9 + 1e-5 for b in grid] for layer in layers]
    devices = [DeviceProfile(name=d.name, kind="check:nominal", memory_bytes=d.memory or 2**30, batch_sizes=grid,
                             forward_s=forward, backward_s=[[2 * t for t in row] for row in forward])
               for d in cluster.devices]
    return Profile(source="synthetic", cluster=cluster.name, model=MODEL, granularity=GRANULARITY, layers=layers,
                   devices=devices, default_bytes_per_s=cluster.bandwidth)


def check_training(cluster: ClusterSpec, timeout_s: float, threads: int) -> tuple[str, list[float]]:
    """Train `check_plan(cluster)` through the runtime; (detail, per-round losses); StepFailed when a
    worker fails or the loss does not fall."""
    from hppctl.runtime.config import TrainOptions
    from hppctl.runtime.launch import prepare_local_workers
    from hppctl.runtime.preflight import preflight
    from hppctl.runtime.session import RunRequest, Session

    # The local workers' fork server first, as `hppctl run` starts it: nothing before has computed with
    # torch (step 1 only imports it), so from the CLI it is a fork of this process (runtime/zygote.py).
    prepare_local_workers(cluster, [d.name for d in cluster.devices], model=MODEL, fork_from_here=True)
    plan = check_plan(cluster)
    preflight(plan, cluster, DATASET)
    options = TrainOptions(dataset=DATASET, seed=0, rounds=ROUNDS, optimizer=OPTIMIZER, lr=LR, threads=threads,
                           timeout_s=timeout_s)
    try:
        result = Session(RunRequest(plan, cluster, options)).run()
    except HppctlError as e:
        raise StepFailed(f"training: {_first_line(e)}", e.exit_code if isinstance(e, BadInput) else 1) from None
    losses = [row["loss"] for row in result.rounds]
    shape = " | ".join(", ".join(s.devices) for s in plan.stages)
    ok, curve = judge_learning(losses)
    if not ok:
        raise StepFailed(f"training: did not learn: {curve} on stages {shape}")
    return f"{MODEL} on {DATASET}, stages {shape}: {curve}", losses


def judge_learning(losses: list[float]) -> tuple[bool, str]:
    """(learned, what the loss did): learned when all `ROUNDS` ran and the last two rounds' mean loss
    is below `LEARNED_RATIO` of the first two's (a NaN fails: no comparison with it is true)."""
    first, last = _mean(losses[:2]), _mean(losses[-2:])
    curve = f"loss {first:.3f} -> {last:.3f} over {len(losses)} rounds"
    if len(losses) < ROUNDS or not last < LEARNED_RATIO * first:
        return False, f"{curve} (needs below {LEARNED_RATIO:g} x the start)"
    return True, curve


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _first_line(error: Exception) -> str:
    """A worker's failure carries its last output lines below the first; the step keeps the first."""
    return (str(error).splitlines() or [error.__class__.__name__])[0]


def worker_threads(cluster: ClusterSpec) -> int:
    """As `hppctl run` chooses: the cores shared by the local workers when every device is local, else
    torch's default (SSH workers follow their host's OMP_NUM_THREADS)."""
    import os

    if all(d.local for d in cluster.devices):
        return max(1, (os.cpu_count() or 1) // len(cluster.devices))
    return 0


# --- the whole check ------------------------------------------------------------------------------
def run_check(cluster: ClusterSpec, *, source: str, timeout_s: float,
              on_step: Callable[[Step], None] | None = None) -> CheckReport:
    """Run the four steps on `cluster` (loaded from `source`), stopping at the first that fails."""
    threads = worker_threads(cluster)
    report = CheckReport()
    started = time.perf_counter()
    steps: list[tuple[str, Callable[[], str]]] = [
        ("install", check_install),
        ("cluster", lambda: f"{source}: {describe_cluster(cluster)}"),
        ("devices", lambda: check_devices(cluster, timeout_s)),
        ("train", lambda: check_training(cluster, timeout_s, threads)[0]),
    ]
    for name, step in steps:
        begin = time.perf_counter()
        try:
            done = Step(name, True, step(), time.perf_counter() - begin)
        except StepFailed as e:
            done = Step(name, False, str(e), time.perf_counter() - begin, e.exit_code)
        except RuntimeFailure as e:
            done = Step(name, False, f"{name}: {_first_line(e)}", time.perf_counter() - begin, 1)
        report.steps.append(done)
        if on_step:
            on_step(done)
        if not done.ok:
            break
    report.wall_s = time.perf_counter() - started
    return report
