"""The launcher's side of a run (the embedded coordinator): store, workers, rounds, checkpoints, result.

    session = Session(RunRequest(plan, cluster, options, checkpoint_dir=…, resume=True))
    result = session.run(on_round=print)          # RunResult: metrics rows, final stage states

`Session.run` hosts the store, starts one worker per device of the plan (local subprocesses or
fabric over SSH), admits them when their join proofs check, then watches: per-round reports become
metrics rows, stage states become checkpoint rounds, a worker that exits with an error (or reports
one) fails the run naming the device and its last output lines. The store, launch, admission and
liveness machinery is `runtime.launcher.Launcher`'s. The training loop (`_watch`) is owned here once;
fault tolerance (runtime/ft_session.py) plugs in through its hooks: `_on_tick`, `_on_worker_exit`,
`_round_report`, `_finished`, `_release` and `_adopt`. Lineage and fingerprints live in runtime/lineage.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hppctl.errors import Diverged
from hppctl.models.cluster import ClusterSpec
from hppctl.models.plan import HppPlan
from hppctl.models.reports import RoundReport
from hppctl.runtime import bootstrap, wire
from hppctl.runtime.checkpoint import CheckpointDir, CheckpointLocked, check_expected_start, checkpoint_rounds
from hppctl.runtime.config import TrainOptions, WorkerConfig
from hppctl.runtime.divergence import DivergenceGuard, check_final_states
from hppctl.runtime.launcher import Launcher, WorkerFailed, add_row, from_blob, last_end, to_blob  # noqa: F401
from hppctl.runtime.lineage import Lineage, plan_digest, plan_document, resume_fingerprint, run_fingerprint  # noqa: F401
from hppctl.runtime.metrics import TraceBuilder, aggregate
from hppctl.runtime.progress import Throttle
from hppctl.runtime.topology import Topology


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


@dataclass
class RoundLoop:
    """What the training loop carries from one pass to the next (`Session._watch`, started per run)."""

    options: TrainOptions | None = None
    on_round: Callable[[dict], None] | None = None
    rows: list[dict] = field(default_factory=list)
    memory: dict[str, dict] = field(default_factory=dict)
    """Per device, from its last report (`RunResult.workers`)."""
    trace: TraceBuilder | None = None
    next_round: int = 0
    """The next round whose reports are taken."""
    emitted: int = 0
    """Rows exist for every round before this one (a re-plan replays rounds that have theirs)."""
    previous_end: float | None = None
    """When the last round taken ended (the next round's time starts there)."""
    rounds_per_epoch: int = 1

    def start(self, options: TrainOptions, start_round: int, on_round, rounds_per_epoch: int,
              trace: TraceBuilder | None) -> "RoundLoop":
        self.options, self.on_round, self.rounds_per_epoch, self.trace = options, on_round, rounds_per_epoch, trace
        self.rows, self.memory, self.previous_end = [], {}, None
        self.next_round = self.emitted = start_round
        return self


def _load_states(blobs: dict[int, bytes]) -> dict[int, dict]:
    return {p: from_blob(b) for p, b in blobs.items()}


class Session(Launcher):
    """The training launcher (HPP, Bi-Partition, nf1b, pipedream): ships init and resumed stage
    states, turns reports into metrics rows, writes checkpoints and collects the final stages."""

    def __init__(self, request: RunRequest) -> None:
        from hppctl.schedule import check_schedule, schedule_for_plan

        super().__init__(request)
        self.plan: HppPlan = request.plan
        """The plan in force: the request's, until fault tolerance re-plans (runtime/ft_session.py)."""
        self.schedule = request.schedule or schedule_for_plan(request.plan)
        check_schedule(self.schedule)
        self.topo = Topology.of(self.schedule)
        self.ckpt = CheckpointDir(request.checkpoint_dir) if request.checkpoint_dir else None
        self._guard = DivergenceGuard(request.options.divergence_factor)
        self._due: set[int] = set()
        """Checkpoint rounds still to write (`_write_due_checkpoints`)."""
        self.loop = RoundLoop()

    def _model(self) -> str:
        return self.plan.model

    # --- the run ------------------------------------------------------------------------------
    def run(self, *, on_round: Callable[[dict], None] | None = None,
            on_event: Callable[[str], None] | None = None) -> RunResult:
        started = time.perf_counter()
        notify = on_event or (lambda message: None)
        self.lock_checkpoint()
        try:
            start_round, init = self._resume_point()
            self.start_round = start_round
            check_expected_start(self.request.checkpoint_dir, self.request.expected_start, start_round)
            options = self.request.options.model_copy(update={"start_round": start_round})
            if start_round >= options.rounds:
                notify(f"the checkpoint already holds round {start_round} of {options.rounds}; nothing to run")
                return RunResult(start_round, [], _load_states(init), time.perf_counter() - started)
            self.on_phase("workers")
            self._prepare()

            def ship(store) -> None:
                blobs = {wire.init(p): b for p, b in enumerate(self._initial_blobs(options.seed))}
                for key, blob in {**blobs, **{wire.resume(p): b for p, b in init.items()}}.items():
                    bootstrap.put_blob(store, key, blob)

            def collect() -> tuple:
                return *self._watch(options, start_round, on_round), self._final_states(options)

            rounds, trace, memory, states = self._run_workers(
                options.timeout_s, ship=ship, config_of=lambda device: self._config(device, options, bool(init)),
                collect=collect, notify=notify)
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
        resume = self.ckpt and self.request.resume
        found = self.ckpt.latest(resume_fingerprint(self.request.plan, self.request.options)) if resume else None
        return found or (0, {})

    def _initial_blobs(self, seed: int) -> list[bytes]:
        from hppctl.runtime.bipartition import union_layers
        from hppctl.runtime.stage import initial_stage_tensors

        plan = self.request.plan
        # Bi-Partition: a worker holds the layers it forwards and those it backwards.
        held = [union_layers(s.layers, s.backward_layers) for s in plan.stages]
        return [to_blob(tensors) for tensors in initial_stage_tensors(plan.model, plan.granularity, held, seed=seed,
                                                                      state=self.request.initial_state)]

    def _config(self, device: str, options: TrainOptions, resume: bool) -> WorkerConfig:
        plan = self.request.plan
        return WorkerConfig(device=device, store_host=self.store.host, store_port=self.store.port, model=plan.model,
                            model_input=plan.model_input, granularity=plan.granularity, schedule=self.schedule,
                            options=options, resume=resume,
                            accelerator=self.request.cluster.device(device).accelerator)

    def _watch(self, options: TrainOptions, start_round: int, on_round) -> tuple[list[dict], dict | None, dict]:
        """The training loop, owned here once: liveness, the subclass's tick, reports into rows,
        due checkpoints, in-round progress, until every round is in and the workers finished."""
        trace = TraceBuilder(self.topo, f"hppctl run: {self.request.plan.model}") if options.trace else None
        loop = self.loop.start(options, start_round, on_round, self._rounds_per_epoch(options), trace)
        self._due = self._due_rounds(options, start_round)
        steps = Throttle(options.progress_every_s)
        while True:
            self._check_alive()
            self._on_tick()
            self._consume_reports(options.rounds)
            self._write_due_checkpoints(options, checked=loop.next_round)
            if loop.next_round < options.rounds:
                self._show_progress(steps, loop.next_round)
            elif self._finished():
                break
            time.sleep(0.02)
        doc = trace.document({"rounds": len(loop.rows)}) if trace else None
        return loop.rows, doc, loop.memory

    def _consume_reports(self, until: int) -> None:
        """Turn every round before `until` that all devices of the current layout reported into a row;
        rounds replayed after a re-plan (`_adopt`) are taken again but have their rows already."""
        loop = self.loop
        while loop.next_round < until and (reports := self._take_round(loop.next_round)) is not None:
            r = loop.next_round
            loop.memory.update({d: report.memory() for d, report in reports.items()})
            extra = self._round_report(r, reports)
            if r >= loop.emitted:
                fields = {d: report.model_dump() for d, report in reports.items()}  # runtime/metrics.py's input
                for report in fields.values() if loop.trace else ():
                    loop.trace.add(report)
                row = {**aggregate(r, fields, self.topo, loop.previous_end, loop.rounds_per_epoch), **extra}
                add_row(loop.rows, row, loop.on_round)
                self._check_divergence(row, loop.options)
                loop.emitted = r + 1
            loop.previous_end = max(x.started_at + x.duration_s for x in reports.values())
            loop.next_round += 1

    def _due_rounds(self, options: TrainOptions, after: int) -> set[int]:
        """The checkpoint rounds after round `after` (`--checkpoint-every`)."""
        return checkpoint_rounds(after, options.checkpoint_every, options.rounds) if self.ckpt else set()

    # --- hooks (fault tolerance, runtime/ft_session.py, plugs in here) ------------------------------------
    def _on_tick(self) -> None:
        """Called once per pass of the loop, after the liveness check (fault tolerance: detect, re-plan)."""

    def _round_report(self, round_index: int, reports: dict[str, RoundReport]) -> dict:
        """Called with every round's reports as they are taken (replayed ones too): fields to add to its row."""
        return {}

    def _finished(self) -> bool:
        """Every round is in: have the workers finished? (fault tolerance: the current generation's)"""
        return self._all_done()

    def _release(self) -> None:
        """Called once the final stage states are in hand (fault tolerance: tell the workers to end)."""

    def _adopt(self, plan: HppPlan, resume: int) -> None:
        """Train on `plan` from round `resume` on (fault tolerance re-planned): its schedule and topology
        take over, rounds from `resume` are taken again and due checkpoints counted from it."""
        from hppctl.schedule import check_schedule, schedule_for_plan

        self.plan = plan
        self.schedule = schedule_for_plan(plan)
        check_schedule(self.schedule)
        self.topo = Topology.of(self.schedule)
        self.loop.next_round = min(self.loop.next_round, resume)
        self._due = self._due_rounds(self.loop.options, resume)

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
            if r < checked and all(bootstrap.has_blob(store, wire.ckpt(r, p)) for p in stages):
                blobs = {p: bootstrap.get_blob(store, wire.ckpt(r, p), delete=True) for p in stages}
                self.ckpt.write_round(r, blobs, self._checkpoint_meta(options))
                self._due.discard(r)

    def _write_final(self, blobs: dict[int, bytes], options: TrainOptions) -> dict[int, dict]:
        """The final stage states, written as the last checkpoint round; `Diverged` instead if one
        holds NaN or infinity (the last round's update can break weights its loss never saw)."""
        states = _load_states(blobs)
        if self._guard.enabled:
            check_final_states({f"stage {p}'s": state for p, state in sorted(states.items())}, options.rounds - 1)
        if self.ckpt:
            self.ckpt.write_round(options.rounds, blobs, self._checkpoint_meta(options))
        return states

    def _rounds_per_epoch(self, options: TrainOptions) -> int:
        from hppctl.runtime.data import load_data

        return max(1, len(load_data(options.dataset, self.request.plan.model).train) // self.topo.global_batch)

    def _final_states(self, options: TrainOptions) -> dict[int, dict]:
        store = self.store.store
        blobs = {p: bootstrap.get_blob(store, wire.final(p), delete=True) for p in range(self.topo.num_stages)}
        states = self._write_final(blobs, options)
        self._release()
        return states

    def _lineage(self) -> Lineage:
        return self.request.lineage or Lineage(origin=plan_digest(self.request.plan))

    def _checkpoint_meta(self, options: TrainOptions) -> dict:
        """What a checkpoint records: what a resuming run must share with it, and the plan's lineage."""
        return {**run_fingerprint(self.plan, options), **self._lineage().as_meta()}
