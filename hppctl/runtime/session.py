"""The launcher's side of a run (the embedded coordinator): store, workers, rounds, checkpoints, result.

    session = Session(RunRequest(plan, cluster, options, checkpoint_dir=…, resume=True))
    result = session.run(on_round=print)          # RunResult: metrics rows, final stage states

`Session.run` hosts the store, starts one worker per device of the plan (local subprocesses or
fabric over SSH), admits them when their join proofs check, then watches: per-round reports become
metrics rows, stage states become checkpoint rounds, a worker that exits with an error (or reports
one) fails the run naming the device and its last output lines. The fault-tolerance issue replaces
that last rule with recovery; the hooks are `_watch` (liveness) and `_fail`.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hppctl.errors import Diverged, RuntimeFailure
from hppctl.models.cluster import ClusterSpec
from hppctl.models.plan import HppPlan
from hppctl.runtime import bootstrap
from hppctl.runtime.checkpoint import CheckpointDir, CheckpointLocked
from hppctl.runtime.config import TrainOptions, WorkerConfig
from hppctl.runtime.divergence import DivergenceGuard, first_nonfinite_tensor
from hppctl.runtime.launch import LocalWorker, SshWorker, WorkerProcess, prepare_local_workers, stop_workers
from hppctl.runtime.metrics import TraceBuilder, aggregate
from hppctl.runtime.progress import StepProgress, Throttle, read_steps, slowest
from hppctl.runtime.topology import Topology


class WorkerFailed(RuntimeFailure):
    """A worker exited with an error or reported one."""


@dataclass(frozen=True)
class Lineage:
    """Where a run's plan comes from, written into every checkpoint: so that `--resume` with the plan a
    run was started with continues on the plan fault tolerance re-planned it to (checkpoint.py:
    `plan_to_resume`)."""

    origin: str
    """`plan_digest` of the plan the run was first started with."""
    lost: tuple[str, ...] = ()
    """Devices re-planned without since then, in the order they were lost."""

    def as_meta(self) -> dict:
        return {"origin_plan": self.origin, "lost": list(self.lost)}


@dataclass(frozen=True)
class RunRequest:
    plan: HppPlan
    cluster: ClusterSpec
    options: TrainOptions
    checkpoint_dir: Path | None = None
    resume: bool = False
    listen: str | None = None
    """HOST or HOST:PORT for the store; default: 127.0.0.1 when every device is local, else the
    address this machine uses to reach the first SSH device."""
    log: object = None
    """A text file receiving every worker's output lines, prefixed with the device name."""
    env: dict = field(default_factory=dict)
    """Extra environment for the workers (e.g. OMP_NUM_THREADS)."""
    schedule: object = None
    """A `Schedule` to run instead of the plan's own round: an asynchronous window (nf1b, pipedream;
    hppctl.runtime.async_exec.plans.epoch_schedule), one round = one epoch."""
    lineage: Lineage | None = None
    """Where `plan` comes from (a resumed run's, from its checkpoint); None: the plan is its own origin."""
    initial_state: dict | None = None
    """Trained weights to start from instead of the seed's (`--init-from`, runtime/warmstart.py): the
    whole model's parameters and persistent buffers under the wrapper's names. A resumed round is
    still loaded over them."""
    expected_start: int | None = None
    """The round the run must resume from (`--more-rounds` counted its rounds from it): another round
    once the lock is held means another run wrote one in between, and this one stops (exit 75)."""


@dataclass
class RunResult:
    start_round: int
    rounds: list[dict]
    stage_states: dict[int, dict]
    """Per stage: {"model": state dict (model names), "optimizer": state dict, …}."""
    wall_s: float
    trace: dict | None = None
    workers: dict[str, dict] = field(default_factory=dict)
    """Per device, from its last report: memory figures, host name and CPU cgroup."""

    def model_state(self) -> dict:
        """The whole model's state dict (ZooModule names: `model.…`), joined from the stages."""
        merged: dict = {}
        for p in sorted(self.stage_states):
            merged.update(self.stage_states[p]["model"])
        return merged


def run_fingerprint(plan: HppPlan, options: TrainOptions) -> dict:
    """What a checkpoint must share with a run that resumes from it."""
    keep = ("dataset", "seed", "optimizer", "lr", "momentum", "weight_decay")
    return {"plan": plan_document(plan), **{k: getattr(options, k) for k in keep}, "lr_schedule": _schedule_text(options)}


def resume_fingerprint(plan: HppPlan, options: TrainOptions) -> dict:
    """What the newest round must share with a run resuming from it: `run_fingerprint`, but for the
    learning-rate schedule when the run starts a new schedule cycle (`--more-rounds`: the cycle
    begins at the resumed round, whatever the previous one was)."""
    keep = run_fingerprint(plan, options)
    if options.schedule_start > 0:
        del keep["lr_schedule"]
    return keep


def _schedule_text(options: TrainOptions) -> str | None:
    """The learning-rate schedule as a checkpoint records it: None for a constant rate (what
    checkpoints written before schedules existed hold); a cosine's total rounds are part of it, and
    the round its cycle started from when that is not 0 (`--more-rounds`)."""
    if options.lr_schedule == "constant" and not options.warmup_rounds:
        return None
    parts = [options.lr_schedule] + ([f"{options.rounds} rounds"] if options.lr_schedule == "cosine" else [])
    parts += [f"{options.warmup_rounds} warm-up rounds"] if options.warmup_rounds else []
    return ", ".join(parts + ([f"cycle from round {options.schedule_start}"] if options.schedule_start else []))


def plan_document(plan: HppPlan) -> dict:
    """The plan as a checkpoint records it (how long planning took is not part of a plan's identity)."""
    return plan.model_dump(mode="json", exclude={"planning_time_s"})


def plan_digest(plan: HppPlan) -> str:
    text = json.dumps(plan_document(plan), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _load_states(blobs: dict[int, bytes]) -> dict[int, dict]:
    import torch

    return {p: torch.load(io.BytesIO(b), weights_only=True) for p, b in blobs.items()}


class Session:
    def __init__(self, request: RunRequest) -> None:
        from hppctl.schedule import check_schedule, schedule_for_plan

        self.request = request
        self.plan: HppPlan = request.plan
        """The plan in force: the request's, until fault tolerance re-plans (runtime/recovery.py)."""
        self.schedule = request.schedule or schedule_for_plan(request.plan)
        check_schedule(self.schedule)
        self.topo = Topology.of(self.schedule)
        self.ckpt = CheckpointDir(request.checkpoint_dir) if request.checkpoint_dir else None
        self.workers: dict[str, WorkerProcess] = {}
        self.store: bootstrap.RunStore | None = None
        self._guard = DivergenceGuard(request.options.divergence_factor)
        self._due: set[int] = set()
        """Checkpoint rounds still to write (`_write_due_checkpoints`)."""
        self.on_phase: Callable[[str], None] = lambda phase: None
        """Called as the run enters "workers" (start and join) and "training" (the rounds)."""
        self.on_step: Callable[[StepProgress], None] | None = None
        """Called with the slowest device's progress within the running round, when the workers
        report one (long rounds: an nf1b or pipedream epoch; runtime/progress.py)."""

    # --- the run ------------------------------------------------------------------------------
    def run(self, *, on_round: Callable[[dict], None] | None = None,
            on_event: Callable[[str], None] | None = None) -> RunResult:
        started = time.perf_counter()
        notify = on_event or (lambda message: None)
        self.lock_checkpoint()
        try:
            start_round, init = self._resume_point()
            self._check_expected_start(start_round)
            options = self.request.options.model_copy(update={"start_round": start_round})
            if start_round >= options.rounds:
                notify(f"the checkpoint already holds round {start_round} of {options.rounds}; nothing to run")
                return RunResult(start_round, [], _load_states(init), time.perf_counter() - started)
            self.on_phase("workers")
            prepare_local_workers(self.request.cluster, self.topo.devices, self.request.env)
            self.store = self._host_store(options.timeout_s)
            try:
                for p, blob in enumerate(self._initial_blobs(options.seed)):
                    bootstrap.put_blob(self.store.store, f"init/{p}", blob)
                for p, blob in init.items():
                    bootstrap.put_blob(self.store.store, f"resume/{p}", blob)
                nonce = self.store.publish_nonce()
                self._launch(options, resume=bool(init))
                notify(f"started {len(self.workers)} workers; store on {self.store.host}:{self.store.port}")
                self._admit(nonce, options.timeout_s)
                notify("all workers joined")
                self.on_phase("training")
                rounds, trace, memory = self._watch(options, start_round, on_round)
                states = self._final_states(options)
            finally:
                self._stop_all()
                self.store.close()
        finally:
            self.unlock_checkpoint()
        return RunResult(start_round, rounds, states, time.perf_counter() - started, trace, memory)

    def lock_checkpoint(self) -> None:
        """Take the checkpoint directory's lock now (`CheckpointLocked`, exit 75, if another run holds
        it): the CLI calls this before it prints or opens anything, so a second run is refused
        with one line and touches nothing. `run` takes it if not held yet and releases it."""
        if self.ckpt:
            self.ckpt.lock()

    def unlock_checkpoint(self) -> None:
        if self.ckpt:
            self.ckpt.unlock()

    def _resume_point(self) -> tuple[int, dict[int, bytes]]:
        if not (self.ckpt and self.request.resume):
            return 0, {}
        found = self.ckpt.latest(resume_fingerprint(self.request.plan, self.request.options))
        if found is None:
            return 0, {}
        return found

    def _check_expected_start(self, start_round: int) -> None:
        """The CLI counted `--more-rounds` from the newest round before the lock was held; a run that
        held it meanwhile may have written a newer one (exit 75, as if it still held the lock)."""
        expected = self.request.expected_start
        if expected is not None and start_round != expected:
            raise CheckpointLocked(f"--checkpoint-dir {self.request.checkpoint_dir}: another run wrote round "
                                   f"{start_round} after this one counted its rounds from round {expected}; "
                                   f"try again")

    def _initial_blobs(self, seed: int) -> list[bytes]:
        import torch

        from hppctl.runtime.stage import initial_stage_tensors

        plan = self.request.plan
        blobs = []
        # Bi-Partition: a worker holds the layers it forwards and those it backwards.
        held = [(min(s.start, s.backward[0]), max(s.end, s.backward[1])) for s in plan.stages]
        for tensors in initial_stage_tensors(plan.model, plan.granularity, held, seed=seed,
                                             state=self.request.initial_state):
            buf = io.BytesIO()
            torch.save(tensors, buf)
            blobs.append(buf.getvalue())
        return blobs

    def _host_store(self, timeout_s: float) -> bootstrap.RunStore:
        host, port = "127.0.0.1", 0
        if self.request.listen:
            host, port = bootstrap.parse_listen(self.request.listen)
        else:
            remote = [d for d in self.topo.devices if self.request.cluster.device(d).host is not None]
            if remote:
                host = bootstrap.route_source(self.request.cluster.device(remote[0]).host)
        return bootstrap.RunStore.start(host, port, timeout_s=timeout_s)

    def _launch(self, options: TrainOptions, *, resume: bool) -> None:
        plan = self.request.plan
        for device in self.topo.devices:
            config = self._worker_config(WorkerConfig(
                device=device, store_host=self.store.host, store_port=self.store.port, model=plan.model,
                granularity=plan.granularity, schedule=self.schedule, options=options, resume=resume))
            payload = json.dumps({"token": self.store.token, "config": config.model_dump(mode="json")})
            spec = self.request.cluster.device(device)
            if spec.host is not None:
                self.workers[device] = SshWorker(spec, self.request.cluster, payload, pid_of=self._pid_of,
                                                 log=self.request.log, env=self.request.env)
            else:
                self.workers[device] = LocalWorker(device, payload, env=self.request.env, log=self.request.log)

    def _worker_config(self, config: WorkerConfig) -> WorkerConfig:
        """Hook: what a worker is told (runtime/recovery.py adds the coordinator's address)."""
        return config

    def _pid_of(self, device: str) -> int | None:
        key = f"pid/{device}"
        if self.store is None or not self.store.store.check([key]):
            return None
        words = bootstrap.read_line(self.store.store, key).split()
        return int(words[-1]) if words and words[-1].isdigit() else None

    def _admit(self, nonce: str, timeout_s: float) -> None:
        waiting = set(self.topo.devices)
        deadline = time.monotonic() + timeout_s
        while waiting:
            self._check_alive()
            for device in sorted(waiting):
                ok = self.store.joined(device, nonce)
                if ok is False:
                    raise WorkerFailed(f"{device}: join refused (wrong run token)")
                if ok:
                    waiting.discard(device)
            if time.monotonic() > deadline:
                raise WorkerFailed(f"timed out after {timeout_s:.0f} s waiting for {', '.join(sorted(waiting))} to join")
            time.sleep(0.05)
        self.store.store.set("start", "1")

    def _watch(self, options: TrainOptions, start_round: int, on_round) -> tuple[list[dict], dict | None, dict]:
        store, devices = self.store.store, list(self.topo.devices)
        rounds_per_epoch = self._rounds_per_epoch(options)
        self._due = {r for r in range(start_round + 1, options.rounds)
                     if options.checkpoint_every and r % options.checkpoint_every == 0} if self.ckpt else set()
        trace = TraceBuilder(self.topo, f"hppctl run: {self.request.plan.model}") if options.trace else None
        rows, memory, previous_end, next_round = [], {}, None, start_round
        steps = Throttle(options.progress_every_s)
        while True:
            self._check_alive()
            while next_round < options.rounds and store.check([f"metrics/{next_round}/{d}" for d in devices]):
                reports = {}
                for d in devices:
                    key = f"metrics/{next_round}/{d}"
                    reports[d] = bootstrap.read_json(store, key)
                    store.delete_key(key)
                    if trace:
                        trace.add(reports[d])
                    memory[d] = {k: reports[d][k] for k in ("rss_bytes", "peak_rss_bytes", "baseline_rss_bytes",
                                                            "host", "cgroup")}
                row = aggregate(next_round, reports, self.topo, previous_end, rounds_per_epoch)
                previous_end = row["ended_at"]
                rows.append(row)
                if on_round:
                    on_round(row)
                self._check_divergence(row, options)
                next_round += 1
            self._write_due_checkpoints(options, checked=next_round)
            if self.on_step is not None and next_round < options.rounds and steps.due():
                step = slowest(read_steps(store, devices), next_round)
                if step is not None and step.round == next_round:
                    self.on_step(step)
            if store.check([f"done/{d}" for d in devices]) and next_round >= options.rounds:
                break
            time.sleep(0.02)
        doc = trace.document({"rounds": len(rows)}) if trace else None
        return rows, doc, memory

    # --- divergence and checkpoints ---------------------------------------------------------------
    def _check_divergence(self, row: dict, options: TrainOptions) -> None:
        """Stop the run (`Diverged`, exit 4) if the round's loss diverged, after writing every due
        checkpoint of a round before it: checkpoint round r holds the weights round r's loss was
        computed with, so only rounds whose loss passed are written (runtime/divergence.py)."""
        try:
            self._guard.check(row["round"], row.get("loss"))
        except Diverged:
            self._write_due_checkpoints(options, checked=row["round"])
            raise

    def _write_due_checkpoints(self, options: TrainOptions, *, checked: int) -> None:
        """Write each due checkpoint round r < `checked` (the rounds whose loss passed the divergence
        check) whose stage states have all arrived."""
        store = self.store.store
        stages = range(self.topo.num_stages)
        for r in sorted(self._due):
            if r < checked and all(bootstrap.has_blob(store, f"ckpt/{r}/{p}") for p in stages):
                blobs = {p: bootstrap.get_blob(store, f"ckpt/{r}/{p}", delete=True) for p in stages}
                self.ckpt.write_round(r, blobs, self._checkpoint_meta(options))
                self._due.discard(r)

    def _write_final(self, blobs: dict[int, bytes], options: TrainOptions) -> dict[int, dict]:
        """The final stage states, written as the last checkpoint round; `Diverged` instead if one
        holds NaN or infinity (the last round's update can break weights its loss never saw)."""
        states = _load_states(blobs)
        if self._guard.enabled:
            for p, state in sorted(states.items()):
                name = first_nonfinite_tensor(state)
                if name is not None:
                    raise Diverged(f"training diverged: after round {options.rounds - 1}, stage {p}'s {name} "
                                   f"holds NaN or infinity (lower --lr; --divergence-factor 0 turns this check off)")
        if self.ckpt:
            self.ckpt.write_round(options.rounds, blobs, self._checkpoint_meta(options))
        return states

    def _rounds_per_epoch(self, options: TrainOptions) -> int:
        from hppctl.runtime.data import load_data

        return max(1, len(load_data(options.dataset, self.request.plan.model).train) // self.topo.global_batch)

    def _final_states(self, options: TrainOptions) -> dict[int, dict]:
        store = self.store.store
        blobs = {p: bootstrap.get_blob(store, f"final/{p}", delete=True) for p in range(self.topo.num_stages)}
        return self._write_final(blobs, options)

    def _lineage(self) -> Lineage:
        return self.request.lineage or Lineage(origin=plan_digest(self.request.plan))

    def _checkpoint_meta(self, options: TrainOptions) -> dict:
        """What a checkpoint records: what a resuming run must share with it, and the plan's lineage."""
        return {**run_fingerprint(self.plan, options), **self._lineage().as_meta()}

    # --- liveness -------------------------------------------------------------------------------
    def _check_alive(self) -> None:
        for device, worker in self.workers.items():
            code = worker.poll()
            if code not in (None, 0):
                self._fail(device, code)

    def _fail(self, device: str, code: int) -> None:
        message = ""
        key = f"failed/{device}"
        if self.store is not None and self.store.store.check([key]):
            message = bootstrap.read_line(self.store.store, key, bootstrap.MAX_MESSAGE_BYTES)[:2000]
        lines = [line for line in self.workers[device].tail() if line.strip()][-12:]
        detail = "\n".join(f"    {line}" for line in lines)
        raise WorkerFailed(f"worker on device {device} failed (exit {code})"
                           + (f": {message}" if message else "") + (f"\n  last lines:\n{detail}" if detail else ""))

    def _stop_all(self) -> None:
        stop_workers(self.workers.values())
