"""The launcher's side of a PSL run (`hppctl psl run`): store, workers, rounds, the final models.

    result = PslSession(PslRunRequest(plan, cluster, PslOptions(train=TrainOptions(rounds=3)))).run()
    result.client_model("pi0")      # client pi0's whole model after the last FedAvg
    summary(result)                 # measured batch makespan against the plan's prediction

It is a `runtime.launcher.Launcher` with PSL's devices: the same store on one address, per-run token
and join proofs, local subprocesses or fabric over SSH, liveness checks and failure messages as the
HPP launcher — only what is launched (`python -m hppctl.runtime.psl.worker`), what is shipped (each
distinct part's initial weights, cut from one model built from the seed, and a resumed round's
device states) and what is collected (per-round batch timings, checkpoint rounds of every device's
state: psl/checkpoint.py, the final parts) differ.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hppctl.errors import Diverged
from hppctl.models.cluster import ClusterSpec
from hppctl.models.psl import PslPlan
from hppctl.models.reports import PslRoundReport
from hppctl.runtime import bootstrap, wire
from hppctl.runtime.checkpoint import CheckpointDir, check_expected_start, checkpoint_rounds
from hppctl.runtime.divergence import DivergenceGuard
from hppctl.runtime.launcher import Launcher, add_row, from_blob, last_end, to_blob
from hppctl.runtime.psl.config import PslOptions, PslWorkerConfig
from hppctl.runtime.psl.topology import PslTopology

WORKER_MODULE = "hppctl.runtime.psl.worker"


@dataclass(frozen=True)
class PslRunRequest:
    plan: PslPlan
    cluster: ClusterSpec
    options: PslOptions
    fedavg_weights: list[float] | None = None
    """w_j per client; None: from the dataset's size and `options.shares` (psl/data.py)."""
    listen: str | None = None
    """HOST or HOST:PORT for the store (as `hppctl run --listen`)."""
    log: object = None
    env: dict = field(default_factory=dict)
    trace: bool = False
    """Lay the batches out as run (`PslRunResult.trace`, Chrome trace events)."""
    checkpoint_dir: Path | None = None
    """Write every device's state there every `checkpoint_every` rounds and at the end (psl/checkpoint.py)."""
    checkpoint_every: int = 1
    resume: bool = False
    """Start from the newest round in `checkpoint_dir` (its settings must be this run's)."""
    expected_start: int | None = None
    """The round the CLI counted `--more-rounds` from, checked again under the lock (`check_expected_start`)."""
    initial_state: dict | None = None
    """Trained weights every part starts from (`--init-from`, checked by runtime/warmstart.py); None:
    the model built from the seed."""


@dataclass
class PslRunResult:
    plan: PslPlan
    rounds: list[dict]
    finals: dict[str, dict]
    """Per device: its parts' state dicts (client: part1, part3; helper: one per client)."""
    wall_s: float
    start_round: int = 0
    """The round the run started from (a resumed run's checkpoint round; `rounds` hold the rounds after it)."""
    workers: dict[str, dict] = field(default_factory=dict)
    order: str = "plan"
    """How the helpers picked their tasks (`PslOptions.order`)."""
    trace: dict | None = None
    """Chrome trace events of the batches and FedAvg as run (`PslRunRequest.trace`)."""

    def client_model(self, client: str) -> dict:
        """Client's whole model (ZooModule names): its parts 1 and 3 and its helper's copy of part 2."""
        helper = dict(zip(self.plan.clients, self.plan.assignment))[client]
        return {**self.finals[client]["part1"], **self.finals[helper][client], **self.finals[client]["part3"]}

    def batch_makespans(self) -> list[float]:
        return [b["makespan_s"] for row in self.rounds for b in row["batches"]]


class PslSession(Launcher):
    """The launcher with a PSL plan: ships the initial parts (and a resumed round's device states),
    turns reports into PSL rows, writes due checkpoints, collects every device's final state."""

    worker_module = WORKER_MODULE
    report_type = PslRoundReport

    def __init__(self, request: PslRunRequest) -> None:
        super().__init__(request)
        self.topo = PslTopology.of(request.plan)
        self._guard = DivergenceGuard(request.options.train.divergence_factor)
        self.ckpt = CheckpointDir(request.checkpoint_dir) if request.checkpoint_dir else None
        self._resumed: tuple[int, dict[int, bytes]] | None = None

    def lock_checkpoint(self) -> None:
        """Take the checkpoint directory's lock (`CheckpointLocked`, exit 75, if another run holds it):
        the driver takes it before any output, `run` again (a no-op then) and releases it."""
        if self.ckpt:
            self.ckpt.lock()

    def unlock_checkpoint(self) -> None:
        if self.ckpt:
            self.ckpt.unlock()

    def run(self, *, on_round: Callable[[dict], None] | None = None,
            on_event: Callable[[str], None] | None = None) -> PslRunResult:
        started = time.perf_counter()
        self.lock_checkpoint()
        try:
            start, resumed = self.resume_point()
            self.start_round = start
            options = self.request.options
            options = options.model_copy(update={"train": options.train.model_copy(update={"start_round": start})})
            if start >= options.train.rounds:  # as `hppctl run`: the checkpoint's model is the result
                (on_event or (lambda message: None))(
                    f"the checkpoint already holds round {start} of {options.train.rounds}; nothing to run "
                    f"(--more-rounds K trains K rounds more)")
                finals = {d: from_blob(resumed[p])["parts"] for p, d in enumerate(self.topo.devices)}
                return PslRunResult(self.request.plan, [], finals, time.perf_counter() - started, start,
                                    order=options.order)
            self.on_phase("workers")
            self._prepare()

            def ship(store) -> None:
                self._ship_initial_parts(store)
                for rank, blob in resumed.items():
                    bootstrap.put_blob(store, wire.resume(rank), blob)

            segments: list | None = [] if self.request.trace else None
            rows, workers, finals = self._run_workers(
                options.train.timeout_s, ship=ship, config_of=self._config(options, bool(resumed)),
                collect=lambda: self._collect(options, on_round, segments), notify=on_event)
        finally:
            self.unlock_checkpoint()
        trace = None if segments is None else run_trace(segments, f"hppctl psl run: {self.request.plan.model}",
                                                        len(rows))
        return PslRunResult(self.request.plan, rows, finals, time.perf_counter() - started, start, workers,
                            options.order, trace)

    def resume_point(self) -> tuple[int, dict[int, bytes]]:
        """(the round to start from, each device's state by rank): (0, {}) unless resuming. Read and
        checked once, under the lock (the driver asks before it opens any output: a refusal writes
        nothing); `BadInput` for a checkpoint this run cannot resume."""
        from hppctl.runtime.psl.checkpoint import resume_point

        if self._resumed is None:
            found = (0, {})
            if self.ckpt and self.request.resume:
                found = resume_point(self.ckpt, self.request.plan, self.request.options)
            check_expected_start(self.request.checkpoint_dir, self.request.expected_start, found[0])
            self._resumed = found
        return self._resumed

    def _ship_initial_parts(self, store) -> None:
        from hppctl.runtime.psl.worker import num_layers
        from hppctl.runtime.stage import initial_stage_tensors

        plan = self.request.plan
        ranges = self.topo.part_ranges(num_layers(plan.model, plan.granularity))
        tensors = initial_stage_tensors(plan.model, plan.granularity, ranges, seed=self.request.options.train.seed,
                                        state=self.request.initial_state)
        for (a, b), part in zip(ranges, tensors):
            bootstrap.put_blob(store, wire.init_part(a, b), to_blob(part))

    def _weights(self) -> list[float]:
        if self.request.fedavg_weights is not None:
            return list(self.request.fedavg_weights)
        from hppctl.runtime.data import load_data
        from hppctl.runtime.psl.data import fedavg_weights

        plan, opts = self.request.plan, self.request.options
        n = len(load_data(opts.train.dataset, plan.model).train)
        return fedavg_weights(n, opts.shares or [1.0] * len(plan.clients))

    def _config(self, options: PslOptions, resume: bool) -> Callable[[str], PslWorkerConfig]:
        req, weights = self.request, self._weights()
        return lambda device: PslWorkerConfig(device=device, store_host=self.store.host, store_port=self.store.port,
                                              plan=req.plan, options=options, fedavg_weights=weights,
                                              checkpoint_every=self._checkpoint_every, resume=resume)

    @property
    def _checkpoint_every(self) -> int:
        """Rounds between checkpoints; 0: no checkpoint directory, none written."""
        return self.request.checkpoint_every if self.ckpt else 0

    def _collect(self, options: PslOptions, on_round, segments: list | None) -> tuple[list[dict], dict, dict]:
        """The rounds' rows, every device's memory figures and final parts; with `segments`, each
        round's segments as run added to it. Checkpoint round c (the state round c trains from) is
        written once round c's loss passed the divergence check, as a layer-wise run's is."""
        start, rounds = options.train.start_round, options.train.rounds
        due = checkpoint_rounds(start, self._checkpoint_every, rounds)
        rows, workers = [], {}
        while True:
            self._check_alive()
            r = start + len(rows)
            if r < rounds and (reports := self._take_round(r)) is not None:
                workers.update({d: report.memory() for d, report in reports.items()})
                if segments is not None:
                    segments += [s for d in self.topo.devices for s in round_segments(reports[d])]
                row = round_row(reports, self.topo, last_end(rows), self.request.plan.batch)
                add_row(rows, row, on_round)
                try:
                    self._guard.check(r, row.get("loss"))
                except Diverged:
                    self._write_checkpoints(due, checked=r, options=options)
                    raise
                continue
            self._write_checkpoints(due, checked=r, options=options)
            if r >= rounds and self._all_done():
                return rows, workers, self._final_states(options)
            time.sleep(0.02)

    def _write_checkpoints(self, due: set[int], *, checked: int, options: PslOptions) -> None:
        """Write each due checkpoint round c < `checked` whose device states have all arrived."""
        store, ranks = self.store.store, range(len(self.topo.devices))
        for c in sorted(due):
            if c < checked and all(bootstrap.has_blob(store, wire.ckpt(c, p)) for p in ranks):
                blobs = {p: bootstrap.get_blob(store, wire.ckpt(c, p), delete=True) for p in ranks}
                self.ckpt.write_round(c, blobs, self._checkpoint_meta(options))
                due.discard(c)

    def _final_states(self, options: PslOptions) -> dict[str, dict]:
        """Every device's final parts, by device; written as the last checkpoint round, or `Diverged`
        if one holds NaN or infinity (the last round's update can break weights its loss never saw)."""
        from hppctl.runtime.divergence import check_final_states

        store, devices = self.store.store, self.topo.devices
        blobs = {p: bootstrap.get_blob(store, wire.final(d), delete=True) for p, d in enumerate(devices)}
        parts = {d: from_blob(blobs[p])["parts"] for p, d in enumerate(devices)}
        if self._guard.enabled:
            check_final_states({f"{d}'s {name}": {"model": state} for d, held in parts.items()
                                for name, state in held.items()}, options.train.rounds - 1)
        if self.ckpt:
            self.ckpt.write_round(options.train.rounds, blobs, self._checkpoint_meta(options))
        return parts

    def _checkpoint_meta(self, options: PslOptions) -> dict:
        from hppctl.runtime.psl.checkpoint import psl_fingerprint

        return psl_fingerprint(self.request.plan, options)


def round_row(reports: dict[str, PslRoundReport], topo: PslTopology, previous_end: float | None, batch: int) -> dict:
    """One metrics line: the round's loss and accuracy over every client's batches, each batch's
    makespan (max_j c_j) with every client's c_j and every helper's tasks as run, FedAvg time."""
    clients = [reports[c] for c in topo.clients]
    batches = []
    for k, first in enumerate(clients[0].batches):
        runs = {c: reports[c].batches[k] for c in topo.clients}
        batches.append({"step": first.step, "makespan_s": max(run.completion_s for run in runs.values()),
                        "clients": {c: {k: getattr(run, k) for k in CLIENT_TIMES} for c, run in runs.items()},
                        "helpers": {h: [list(t) for t in reports[h].batches[k].tasks] for h in topo.helpers}})
    end = max(r.started_at + r.duration_s for r in reports.values())
    start = previous_end if previous_end is not None else min(r.started_at for r in reports.values())
    losses = [b.loss for c in clients for b in c.batches]  # every client batch holds `batch` samples
    return {"round": clients[0].round, "loss": statistics.fmean(losses),
            "train_accuracy": sum(b.correct for c in clients for b in c.batches) / (len(losses) * batch),
            "round_s": end - start, "ended_at": end,
            "fedavg_s": max(r.fedavg_s for r in reports.values()), "batches": batches,
            "devices": {d: {k: getattr(reports[d], k) for k in DEVICE_FIELDS} for d in topo.devices}}


def round_segments(report: PslRoundReport) -> list[tuple[str, str, str, float, float]]:
    """A device's round as run, as (device, label, category, start, end) in wall-clock seconds, the
    simulator's segments (`hppctl psl simulate --trace`) measured: a client's three steps of each
    batch (the gaps between them are its waits for its helper), a helper's tasks, and FedAvg."""
    d, out = report.device, []
    for b in report.batches:
        t = b.started_at
        if report.role == "client":
            out += [(d, "part-1 fwd + upload (r)", "client", t, t + b.sent_s),
                    (d, "part-3 fwd (l) + bwd (l') + upload", "client", t + b.activations_s, t + b.gradients_sent_s),
                    (d, "part-1 bwd (r') + step", "client", t + b.gradients_s, t + b.completion_s)]
        else:
            out += [(d, f"{kind}:{client}", "helper-" + kind, t + start, t + end) for kind, client, start, end, _ in b.tasks]
    end = report.started_at + report.duration_s
    return out + [(d, f"FedAvg (round {report.round})", "fedavg", end - report.fedavg_s, end)]


def run_trace(segments: list[tuple[str, str, str, float, float]], title: str, rounds: int) -> dict:
    """Chrome trace events of a run's segments, in seconds from the first one's start."""
    from hppctl.schedule.psl_sim import segments_trace

    origin = min((s for *_, s, _ in segments), default=0.0)
    doc = segments_trace([(d, label, cat, s - origin, e - origin) for d, label, cat, s, e in segments], title)
    return {**doc, "otherData": {"title": title, "source": "hppctl psl run", "rounds": rounds}}


CLIENT_TIMES = ("completion_s", "sent_s", "activations_s", "gradients_sent_s", "gradients_s")
"""A client batch's times as the metrics line shows them (loss and accuracy are the round's)."""
DEVICE_FIELDS = ("role", "duration_s", "cpu_s", "fedavg_s", "rss_bytes", "peak_rss_bytes")


def summarize(result: PslRunResult) -> dict:
    """The run against its plan: measured batch makespan (median over the batches after the first,
    which pays one-off allocation costs) next to the plan's prediction and the simulator's replay of
    the order the runtime executes; per-client completion; whether every helper ran the plan's order
    (with `--order ltf` the order is decided at run time; `helper_orders` counts the orders that ran)."""
    from hppctl.schedule.psl_sim import simulate_psl
    from hppctl.runtime.psl.topology import collapsed_plan, is_preemptive

    plan, topo = result.plan, PslTopology.of(result.plan)
    makespans = result.batch_makespans()
    steady = makespans[1:] or makespans
    batches = [b for row in result.rounds for b in row["batches"]]
    planned = {c.client: c.completion_s for c in plan.prediction.clients}
    measured = statistics.median(steady) if steady else None  # None: a resumed run with nothing left to run
    followed = bool(batches) and all([tuple(t[:2]) for t in b["helpers"][h]] == list(topo.orders[h]) for b in batches for h in topo.helpers)
    ran: dict[str, dict[str, int]] = {h: {} for h in topo.helpers}
    for b in batches:
        for h in topo.helpers:
            key = " ".join(f"{k}:{c}" for k, c, *_ in b["helpers"][h])
            ran[h][key] = ran[h].get(key, 0) + 1
    return {
        "plan": {"method": plan.method, "model": plan.model, "batch": plan.batch, "clients": len(plan.clients),
                 "helpers": len(plan.helpers), "preemptive": is_preemptive(plan)},
        "rounds": len(result.rounds), "rounds_run": len(result.rounds), "start_round": result.start_round,
        "batches": len(makespans),
        "loss": result.rounds[-1]["loss"] if result.rounds else None,
        "train_accuracy": result.rounds[-1]["train_accuracy"] if result.rounds else None,
        "batch_makespan_s": None if measured is None else {
            "median": measured, "min": min(steady), "max": max(steady), "first": makespans[0], "all": makespans},
        "predicted_makespan_s": plan.prediction.makespan_s,
        "replayed_makespan_s": simulate_psl(collapsed_plan(plan)).makespan_s,
        "measured_vs_predicted": None if measured is None else measured / plan.prediction.makespan_s - 1,
        "clients": {c: {"helper": topo.helper_of[c], "planned_completion_s": planned[c],
                        "median_completion_s": statistics.median(b["clients"][c]["completion_s"]
                                                                 for b in batches[1:] or batches) if batches else None}
                    for c in topo.clients},
        "order": result.order, "helper_order_followed": followed, "helper_orders": ran,
        "fedavg_s": statistics.median(row["fedavg_s"] for row in result.rounds) if result.rounds else None,
        "wall_s": result.wall_s, "workers": result.workers,
    }
