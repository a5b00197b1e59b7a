"""The coordinator embedded in `hppctl run`: heartbeats, probes, re-planning and pipeline replay.

    session = FtSession(RunRequest(plan, cluster, options), RecoveryOptions(profile=profile))
    result = session.run(on_round=print, on_fault=print)     # on_fault: suspected, lost, replanned, resumed

It is `Session` (the launcher: store, workers, rounds, checkpoints) with failure handling in place of
"a worker died, the run fails":

1. detection: every worker beats to a UDP socket on the store's address (runtime/heartbeat.py); a
   device silent for `timeout_s` becomes suspect (ft/state.py), a probe over its own TCP
   connection decides. A worker process that ended without reporting an error is suspect at once.
   A worker that reports an error still fails the run, as before.
2. stop: the coordinator moves to the next *generation*; its acknowledgements tell every survivor to
   abandon the round in progress (runtime/ft_worker.py). The lost worker is fenced (killed if
   it is a local process) so it cannot come back.
3. resume round: survivors report their snapshots and backups; the newest round every old stage can
   restore is the resume round (ft/replay.py).
4. re-plan: light (planner/replan.py: the surviving stages keep their devices, cut points move,
   Algorithm 1 re-splits a stage that lost a device, memory checked, heavy as fallback) or heavy
   (every stage gathered at the coordinator, the full planner from scratch, every stage sent back).
5. resume: the new schedule, the resume round and the transfers go out as `reconf/<gen>`; survivors
   build a new gloo group, move only the layers that change owner, and replay from the resume round.

Events (suspected, lost, replanned, resumed) go to `on_fault` with wall-clock times, so `--metrics`
records them beside the rounds; `on_status` receives the status table once a second.
"""

from __future__ import annotations

import io
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Literal

from hppctl.ft.replay import common_layout, migration_bytes, resume_round, transfer_plan, upload_plan
from hppctl.ft.status import status_rows
from hppctl.errors import RuntimeFailure
from hppctl.models.events import (DeviceLost, DevicesLate, Event, Lost, Replanned, RunEvent, RunEventBase,
                                  RunReplanned, RunResumed)
from hppctl.models.ft_documents import GatherPlan, Reconfiguration
from hppctl.models.plan import HppPlan
from hppctl.models.profile import Profile
from hppctl.models.reports import Inventory, RoundReport
from hppctl.runtime import bootstrap, wire
from hppctl.runtime.config import RecoveryConfig, WorkerConfig
from hppctl.runtime.ft_detection import FaultDetector, Loss
from hppctl.runtime.session import Lineage, RunResult, Session, WorkerFailed

LEAVER_GRACE_S = 10.0
"""How long the end of a run waits for devices that left gracefully to exit on their own before fencing them."""


@dataclass(frozen=True)
class RecoveryOptions:
    profile: Profile | None
    """What re-planning plans on (the profile the plan was made from); None: a lost device fails the run."""
    heartbeat_s: float = 1.0
    timeout_s: float = 3.0
    probe_s: float = 2.0
    replicate_every: int = 1
    replan: Literal["light", "heavy"] = "light"
    stall_timeout_s: float = 120.0
    heartbeat_port: int = 0


class FtSession(Session):
    def __init__(self, request, recovery: RecoveryOptions) -> None:
        super().__init__(request)
        self.recovery = recovery
        self.generation = 0
        self.lost: list[str] = []
        """Devices lost so far, in the order they were lost (checkpoints record it: Lineage)."""
        self.events: list[dict] = []
        self.detector = FaultDetector(timeout_s=recovery.timeout_s, probe_s=recovery.probe_s, emit=self._event)
        """Who is alive (runtime/ft_detection.py); armed once every worker trains."""
        self.ft = FaultState(layout=Layout(0, self.plan, recovery.profile))

    def run(self, *, on_round=None, on_event=None, on_fault: Callable[[RunEvent], None] | None = None,
            on_status: Callable[[list[dict]], None] | None = None,
            on_state: Callable[[Event], None] | None = None) -> RunResult:
        """`on_state`: every event the coordinator's state applies (heartbeats included), as it is
        applied; the state keeps only the last LOG_WINDOW (ft/state.py)."""
        self.ft.on_fault = on_fault or self.ft.on_fault
        self.ft.on_status = on_status
        self.detector.on_state = on_state
        return super().run(on_round=on_round, on_event=on_event)

    # --- set-up ---------------------------------------------------------------------------------
    def _host_store(self, timeout_s: float) -> bootstrap.RunStore:
        store = super()._host_store(timeout_s)
        addresses = {d: heartbeat_addresses(self.request.cluster, d, store.host) for d in self.topo.devices}
        self.detector.listen(store.host, store.token, addresses, port=self.recovery.heartbeat_port)
        return store

    def _worker_config(self, config: WorkerConfig) -> WorkerConfig:
        r = self.recovery
        return config.model_copy(update={"recovery": RecoveryConfig(
            coordinator_host=self.store.host, coordinator_port=self.detector.listener.port, heartbeat_s=r.heartbeat_s,
            timeout_s=r.timeout_s, replicate_every=r.replicate_every, stall_timeout_s=r.stall_timeout_s)})

    def _stop_all(self) -> None:
        # Lost workers are fenced, not stopped: stopping one behind a cut link would hang on SSH. A
        # failed one was fenced when it was lost; one that left may still be handing its layers over
        # when the run ends (a failure elsewhere), so it is fenced here.
        lost = {d: self.workers.pop(d) for d in self.lost if d in self.workers}
        try:
            super()._stop_all()
        finally:
            self.workers.update(lost)
            heard = self.detector.leaver_heard
            let_leavers_go({d: w for d, w in lost.items() if d in heard and d not in self.ft.fenced})
            for device, worker in lost.items():
                if worker.poll() is None:
                    self._fence(device)
            self.detector.stop()

    # --- events -----------------------------------------------------------------------------------
    def _event(self, kind: type[RunEventBase], **fields) -> None:
        """Record an event of `kind` (a typed `RunEvent`, stamped with the wall time and the generation):
        its `--metrics` line form in `events` (the `--json` summary's), the record itself to `on_fault`."""
        event = kind(at=time.time(), generation=self.generation, **fields)
        self.events.append(event.wire())
        self.ft.on_fault(event)

    # --- liveness -----------------------------------------------------------------------------------
    def _on_worker_exit(self, device: str, code: int) -> None:
        """A worker process that ended without reporting an error is suspect at once (a lost one is
        ignored); one that reported an error, or any before every worker trains, fails the run."""
        if device in self.lost:
            return
        if self._reported_failure(device):
            self._fail(device, code)  # the worker reported an error of its own: no replay can help
        if self.detector.state is None:
            self._fail(device, code)  # before every worker trains there is nothing to replay
        if self.detector.alive(device):
            self.detector.suspect(device, 0.0, why=f"exit {code}")

    def _on_tick(self) -> None:
        """Arm detection once every worker is ready, then detect, re-plan and replay; the status table once a second."""
        detector = self.detector
        detector.log_dropped()
        if detector.state is None:
            # Armed once every worker has built its stage and joined the gloo group: before that, a slow
            # start-up is not a failure, and a dead worker simply fails the run.
            if self.store.store.check([wire.ready(d) for d in self.topo.devices]):
                detector.arm(list(self.topo.devices))
            return
        self.ft.helpers = [d for d in self.ft.helpers if self.workers[d].poll() != 0]  # exit 0: all layers sent
        losses = detector.detect(self.lost) + self._failed_leavers(self.ft.helpers, "while handing its layers over")
        if losses:
            self._recover(losses)
        if self.ft.on_status and time.monotonic() - self.ft.last_status > 1.0:
            self.ft.on_status(status_rows(detector.state, self.topo.stage_of, detector.clock()))
            self.ft.last_status = time.monotonic()

    # --- the loop's hooks (runtime/session.py owns the loop) ----------------------------------------------
    def _round_report(self, round_index: int, reports: dict[str, RoundReport]) -> dict:
        """The first round in a new layout ends the recovery ("resumed"); every row carries the
        generation and the backup exchange's bytes and seconds."""
        if self.ft.resumed_pending is not None and round_index >= self.ft.resume_round:
            self._event(RunResumed, round=round_index, recovery_s=round(time.time() - self.ft.resumed_pending, 3),
                        phases=slowest_phases(reports.values()))
            self.ft.resumed_pending = None
            self.ft.helpers = []  # a round completed in the new layout: every layer reached its owner
        return dict(generation=max(x.generation for x in reports.values()),
                    backup_bytes=sum(x.backup_bytes for x in reports.values()),
                    backup_s=max(x.backup_s for x in reports.values()))

    def _finished(self) -> bool:
        return self.store.store.check([wire.finished(self.generation, d) for d in self.topo.devices])

    def _reported_rounds(self) -> int:
        """How many rounds from the start every device of the current layout has reported (read or not).

        A worker keeps a round's snapshot before it reports the round (the backup exchange comes in
        between and can be interrupted): replaying from a snapshot whose round nobody reported would
        leave that round's row missing and the launcher waiting for it forever."""
        store, devices, r = self.store.store, list(self.topo.devices), self.loop.next_round
        while r < self.loop.options.rounds and store.check(wire.metrics_keys(r, devices)):
            r += 1
        return r

    def _release(self) -> None:
        """Tell the workers to end (`end`) and wait a while for them to say they did."""
        store = self.store.store
        store.set(wire.end(), "1")
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline and not store.check(wire.done_keys(self.topo.devices)):
            time.sleep(0.05)  # the states are in hand: a worker slow to leave is stopped by `_stop_all`
        late = [d for d in self.topo.devices if not store.check([wire.done(d)])]
        if late:
            self._event(DevicesLate, devices=late)

    # --- recovery -----------------------------------------------------------------------------------
    def _recover(self, losses: list[Loss]) -> None:
        """Re-plan without the lost devices and replay.

        A device lost before the new configuration goes out (devices that fail together: a power strip,
        a switch) joins the same re-plan: the coordinator moves to a further generation and starts over,
        nobody having trained since. One lost while the survivors move to the new configuration (before
        any round completes in it) is re-planned away from the layout before, which they all still hold
        (`ft/replay.py: common_layout`)."""
        if self.recovery.profile is None:
            loss = losses[0]
            raise WorkerFailed(f"device {loss.device} lost ({loss.reason}); re-planning needs the plan's profile "
                               f"(--profile)")
        detected = time.time()
        leavers: list[str] = []
        self.ft.helpers = []  # a helper that failed is in `losses`; the new layout names its own
        while True:
            for loss in losses:
                if loss.device in leavers or loss.device in self.lost:
                    # it left, then failed before its hand-over (a leaver of this re-plan) or during
                    # it (a helper of the last one): lost already, its layers from its backup
                    if loss.device in leavers:
                        leavers.remove(loss.device)
                    self._event(DeviceLost, device=loss.device, reason=loss.reason)
                    self._fence(loss.device)
                    continue
                self._lose(loss)
                if loss.leaving:
                    leavers.append(loss.device)
                    self.detector.leaver_heard[loss.device] = self.detector.clock()
            generation = self._next_generation()
            survivors = [d for d in self.ft.layout.plan.devices() if d not in self.lost]
            if not survivors:
                raise WorkerFailed(f"{', '.join(self.lost)} lost: no device is left")
            losses, inventories = self._collect(generation, survivors, leavers)
            if losses:
                continue
            base, inventories = self.ft.base_layout(inventories, self.lost)
            gone = [d for d in base.plan.devices() if d in self.lost]
            resume = resume_round([list(s.devices) for s in base.plan.stages], gone, inventories, leavers=leavers,
                                  reported=self._reported_rounds())
            gathered = None
            if self.recovery.replan == "heavy":  # the straw man gathers first, then plans
                losses, gathered = self._gather(generation, base, gone, leavers, resume)
                if losses:
                    continue
            result, replan_s = replan(base, gone, self.recovery.replan)
            if result.method == "heavy" and gathered is None:  # light did not fit: heavy after all
                losses, gathered = self._gather(generation, base, gone, leavers, resume)
                if losses:
                    continue
            break
        self._consume_reports(resume)  # rows of the old layout before the resume round come first
        doc = self._reconfiguration(generation, base, result, gathered, gone, leavers, resume, inventories)
        self._clear_stale(base.plan, resume)
        self.store.store.set(wire.reconf(generation), doc.model_dump_json())
        self.ft.helpers = list(doc.helpers)
        self._adopt_replan(doc, resume, base, result.profile)
        self._event(RunReplanned, method=result.method, requested=self.recovery.replan, lost=gone,
                    resume_round=resume, replan_s=round(replan_s, 4), devices=self.plan.devices(),
                    stages=[{"layers": s.layers, "devices": s.devices, "samples": s.samples} for s in self.plan.stages],
                    moved_bytes=doc.moved_bytes, gathered_bytes=doc.gathered_bytes,
                    layout=base.generation, split_backward=self.plan.split_backward,
                    split_dropped=result.split_dropped)
        self.ft.resumed_pending = detected

    def _next_generation(self) -> int:
        """Tell every survivor, now rather than in its next acknowledgement, to stop and report."""
        self.generation += 1
        self.detector.announce(self.generation)
        return self.generation

    def _lose(self, loss: Loss) -> None:
        self.detector.apply(Lost(device=loss.device, at_s=self.detector.clock(), reason=loss.reason))
        self._event(DeviceLost, device=loss.device, reason=loss.reason)
        self.lost.append(loss.device)
        if not loss.leaving:
            self._fence(loss.device)

    def _fence(self, device: str) -> None:
        """A lost worker must not come back (a stopped process resumed, a link restored): end it, once
        (over SSH each fence is a thread that may wait on a cut link)."""
        if device in self.ft.fenced:
            return
        self.ft.fenced.add(device)
        worker = self.workers[device]
        proc = getattr(worker, "proc", None)
        if proc is not None:
            proc.kill()
        else:
            threading.Thread(target=worker.stop, daemon=True, name=f"fence-{device}").start()

    def _collect(self, generation: int, survivors: list[str],
                 leavers: list[str]) -> tuple[list[Loss], dict[str, Inventory]]:
        """Every device's `stall/<generation>` report (its inventory), watching them meanwhile: ([], reports), or the
        devices lost before all had reported (and no reports)."""
        devices = survivors + leavers
        store, keys = self.store.store, [wire.stall(generation, d) for d in devices]
        losses = self._await(lambda: store.check(keys), f"{', '.join(devices)} to stop for the re-plan", leavers)
        return losses, ({} if losses else {d: self._read_document(d, k, Inventory) for d, k in zip(devices, keys)})

    def _await(self, done: Callable[[], bool], what: str, leavers: list[str]) -> list[Loss]:
        """Wait for `done` while detection goes on: [] once it holds, else the devices lost meanwhile
        (a leaver whose process ended counts: it has not handed its layers over yet). A worker that
        reports an error of its own still fails the run (`_check_alive`)."""
        deadline = time.monotonic() + self.recovery.stall_timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            self.detector.log_dropped()
            losses = self.detector.detect(self.lost) + self._failed_leavers(leavers, "before handing its layers over")
            if losses:
                return losses
            if done():
                return []
            time.sleep(0.02)
        raise RuntimeFailure(f"timed out after {self.recovery.stall_timeout_s:.0f} s waiting for {what}")

    def _failed_leavers(self, leavers: list[str], when: str) -> list[Loss]:
        """Leavers that can no longer hand their layers over: their process ended, or they have been silent
        (frozen, or behind a cut link while their SSH session lives on) for as long as a silent device
        gets before it is lost, the failure timeout plus the probe's."""
        losses = []
        for d in list(leavers):
            code = self.workers[d].poll()
            now = self.detector.clock()
            silent = now - self.detector.leaver_heard.get(d, now)
            if code is not None:
                losses.append(Loss(d, f"left, then ended (exit {code}) {when}"))
            elif silent > self.recovery.timeout_s + self.recovery.probe_s:
                losses.append(Loss(d, f"left, then silent for {silent:.1f} s {when}"))
        return losses

    def _reconfiguration(self, generation: int, base: "Layout", result, gathered: dict | None,
                         gone: list[str], leavers: list[str], resume: int,
                         inventories: dict[str, Inventory]) -> Reconfiguration:
        """`reconf/<generation>` (models/ft_documents.py): the new plan and schedule, the resume round,
        the layout whose state it starts from, where that state comes from, and the bytes it moves."""
        from hppctl.schedule import schedule_for_plan

        common = dict(resume_round=resume, layout=base.generation, lost=gone, method=result.method,
                      plan=result.plan, schedule=schedule_for_plan(result.plan))
        if result.method == "heavy":
            from hppctl.runtime.replication import state_bytes

            return Reconfiguration(**common, moved_bytes=redistribute(self.store.store, generation, result.plan, gathered),
                                   gathered_bytes=sum(state_bytes(gathered).values()))
        from hppctl.runtime.replication import layer_names

        migrations = transfer_plan(base.plan, result.migrations, gone, leavers=leavers)
        sources = {m.source for m in migrations}
        model, granularity = base.plan.model, base.plan.granularity
        moved = migration_bytes(migrations, inventories, resume,
                                lambda start, end: layer_names(model, granularity, start, end))
        return Reconfiguration(**common, moved_bytes=moved, migrations=migrations,
                               helpers=[d for d in leavers if d in sources])

    def _gather(self, generation: int, base: "Layout", gone: list[str], leavers: list[str],
                resume: int) -> tuple[list[Loss], dict | None]:
        """Heavy: every old stage's state comes to the coordinator (through the store, on its links);
        or the devices lost meanwhile."""
        import torch

        store = self.store.store
        uploads = upload_plan(base.plan, gone, leavers=leavers)
        store.set(wire.gather(generation),
                  GatherPlan(resume_round=resume, layout=base.generation, uploads=uploads).model_dump_json())
        keys = [wire.heavy_old(generation, p) for p in uploads]
        losses = self._await(lambda: all(bootstrap.has_blob(store, k) for k in keys), "every stage's state", leavers)
        if losses:
            return losses, None
        merged = {"tensors": {}, "optim": {}}
        for key in keys:
            part = torch.load(io.BytesIO(bootstrap.get_blob(store, key, delete=True)), weights_only=True)
            merged["tensors"].update(part["tensors"])
            merged["optim"].update(part["optim"])
        return [], merged

    def _clear_stale(self, old_plan: HppPlan, resume: int) -> None:
        """Reports and states of the abandoned generation must not mix with the replay's."""
        store = self.store.store
        for r in range(resume, self.loop.options.rounds):
            for d in old_plan.devices():
                store.delete_key(wire.metrics(r, d))
        for p in range(len(old_plan.stages)):
            for key in [wire.final(p)] + [wire.ckpt(r, p) for r in range(resume + 1, self.loop.options.rounds)]:
                if bootstrap.has_blob(store, key):
                    bootstrap.get_blob(store, key, delete=True)

    def _lineage(self) -> Lineage:
        """The request's lineage and the devices this run lost: what its re-planned plan came from."""
        first = super()._lineage()
        return Lineage(origin=first.origin, lost=first.lost + tuple(self.lost))

    def _adopt_replan(self, doc: Reconfiguration, resume: int, base: "Layout", profile: Profile) -> None:
        self._adopt(doc.plan, resume)
        self.ft.previous, self.ft.layout = base, Layout(self.generation, self.plan, profile)
        self.detector.apply(Replanned(at_s=self.detector.clock(), method=doc.method, devices=list(self.topo.devices),
                                      resume_round=resume))
        self.ft.resume_round = resume


@dataclass
class FaultState:
    """What fault tolerance carries across the loop's passes (`FtSession.ft`, made in `__init__`)."""

    layout: "Layout"
    """The layout the workers train on (or are moving to); `previous`: the one it was made from."""
    previous: "Layout | None" = None
    on_fault: Callable[[RunEvent], None] = lambda event: None
    on_status: Callable[[list[dict]], None] | None = None
    last_status: float = 0.0
    helpers: list[str] = field(default_factory=list)
    """Devices that left and are sending their layers to their new owners (until they end, exit 0)."""
    fenced: set[str] = field(default_factory=set)
    resume_round: int = 0
    """The round the last re-plan resumed from."""
    resumed_pending: float | None = None
    """When the losses of a re-plan were detected, until its first round completes (the "resumed" event)."""

    def base_layout(self, inventories: dict[str, Inventory], lost: list[str]) -> tuple["Layout", dict[str, Inventory]]:
        """The layout to re-plan from (the current one, or the one before when a device was lost while the
        survivors were moving to the current one), with every survivor's inventory in it."""
        previous = self.previous.generation if self.previous else None
        picked = common_layout(inventories, self.layout.generation, previous)
        if picked is None:
            layouts = {d: inventory.layout for d, inventory in inventories.items()}
            raise WorkerFailed(f"{', '.join(lost)} lost while the survivors were on different layouts "
                               f"({layouts}): no state they all hold; the run stops (--resume continues from the "
                               f"checkpoint directory)")
        layout, chosen = picked
        return (self.layout if layout == self.layout.generation else self.previous), chosen


@dataclass(frozen=True)
class Layout:
    """A plan the workers trained on, or are moving to: made by generation `generation`, over `profile`."""

    generation: int
    plan: HppPlan
    profile: Profile


def heartbeat_addresses(cluster, device: str, store_host: str) -> set[str]:
    """Where this device's heartbeats may come from: its SSH host's address, else this machine's."""
    spec = cluster.device(device)
    if spec.host is not None:
        return {socket.gethostbyname(spec.host)}
    return {"127.0.0.1"} if store_host.startswith("127.") else {store_host}


def replan(base: "Layout", gone: list[str], method: str):
    """The plan without `gone` (light or heavy, as requested), and how long the planner took."""
    from hppctl.planner.replan import replan_heavy, replan_light

    begin = time.perf_counter()
    planner = replan_heavy if method == "heavy" else replan_light
    result = planner(base.plan, base.profile, gone)
    return result, time.perf_counter() - begin


def redistribute(store, generation: int, plan: HppPlan, state: dict) -> int:
    """Every new stage's state to the store, for each of its devices to fetch; returns the bytes of
    state they receive (`state_bytes`: every layer travels, each replica takes its own copy)."""
    from hppctl.runtime.replication import layer_names, state_bytes, subset, to_bytes

    moved = 0
    for p, stage in enumerate(plan.stages):
        part = subset(state, set(layer_names(plan.model, plan.granularity, stage.start, stage.end)))
        bootstrap.put_blob(store, wire.heavy_new(generation, p), to_bytes(part))
        moved += sum(state_bytes(part).values()) * len(stage.devices)
    return moved


def slowest_phases(reports: Iterable[RoundReport]) -> dict[str, float]:
    """Per step of the reconfiguration, the slowest device's seconds (the step everyone waited for)."""
    out: dict[str, float] = {}
    for report in reports:
        for name, seconds in report.recovery_phases.items():
            out[name] = max(out.get(name, 0.0), seconds)
    return out


def let_leavers_go(leavers: dict) -> None:
    """Devices that left gracefully exit on their own once their layers are handed over; on a loaded
    machine the run's last rounds can end first. Wait for them (bounded, LEAVER_GRACE_S in all) before
    the end of the run fences what is left: they were not lost, they left, and their exit status says
    whether the hand-over ended well."""
    deadline = time.monotonic() + LEAVER_GRACE_S
    for worker in leavers.values():
        while worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
