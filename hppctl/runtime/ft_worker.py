"""The worker's side of fault-tolerant pipeline replay (paper §3.4; docs/fault-tolerance.md).

A worker started with `WorkerConfig.recovery` runs `run_ft` instead of the plain loop:

- a `HeartbeatSender` thread beats to the coordinator; a `ProbeResponder` answers its probes;
- after every K-th round it keeps a snapshot of its stage state and, if its stage has one device,
  sends a backup to its backup holder (replication.py) over the run's gloo group;
- every wait on gloo is interruptible: when the coordinator's acknowledgements announce a new
  generation (a device was lost), the round in progress is abandoned wherever it is; a gloo error
  (a peer died) is treated the same way;
- the worker then reports which rounds it can restore (`stall/<gen>/<device>`), waits for the new
  configuration (`reconf/<gen>`), leaves the old process group behind (destroying it would wait
  for operations stuck on the lost device), joins a new gloo group of the survivors under a fresh
  rendezvous prefix (`gen<gen>/`), rebuilds its stage from its snapshot plus the layers it
  receives (light) or from the coordinator (heavy), and replays from the resume round.

A worker that hears no acknowledgement for 1.5x the coordinator's timeout stops cleanly (exit 1,
no traceback): the coordinator is gone, and the checkpoint directory holds complete rounds only.
SIGTERM makes the worker leave gracefully: its beats say `leave`, the coordinator re-plans at once,
and the worker hands its layers over before it exits.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

from hppctl.errors import RuntimeFailure
from hppctl.models.ft_documents import GatherPlan, Reconfiguration
from hppctl.models.reports import Inventory, StateSizes
from hppctl.runtime import bootstrap, wire
from hppctl.runtime.config import WorkerConfig
from hppctl.runtime.ft_transport import RETIRED_GROUPS, AbortableComm, Interrupted, PeerLost, prefixed
from hppctl.runtime.heartbeat import HeartbeatSender, ProbeResponder
from hppctl.runtime.progress import StepReporter
from hppctl.runtime.replication import (Backups, Snapshots, from_bytes, layer_names, merge, meta_model, recv_bytes,
                                        restore_optimizer, send_bytes, stage_state, state_bytes, subset, to_bytes)
from hppctl.runtime.training_state import build_training_state
from hppctl.runtime.worker_entry import WorkerContext, run_worker_process


class Orphaned(RuntimeFailure):
    """No acknowledgement from the coordinator for too long: stop cleanly."""


class Dismissed(Exception):
    """This device is not part of the new configuration (it left, or was declared lost)."""


def _recoverable(error: BaseException) -> bool:
    seen = error
    while seen is not None:
        if isinstance(seen, (Interrupted, PeerLost)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class FtRun:
    """The training loop of one worker across generations (re-plans)."""

    def __init__(self, worker, store, beats: HeartbeatSender) -> None:
        self.w, self.store, self.beats = worker, store, beats
        self.device = worker.device
        self.opts, self.rc = worker.config.options, worker.config.recovery
        self.generation = 0
        self.helpers: list[str] = []
        """Devices in the process group that are not in the schedule (a leaver handing its layers over)."""
        self.kept = Kept(0, Snapshots(), Backups())
        """This worker's snapshots and the backups it holds, in the layout it trains on."""
        self.previous: Kept | None = None
        """What was kept in the layout the current one was made from, until the first round in the new
        layout completes: a device lost while the survivors move to a new configuration leaves some of
        them on each layout, and the coordinator then replays from the previous one, which all still hold."""
        self._sends: list = []
        self._finished = False
        self.backup_bytes = 0
        self.backup_s = 0.0
        self.phases: dict[str, float] = {}
        """Where the last reconfiguration's time went (seconds), reported with the first round after it."""
        self.steps = StepReporter(store, self.device, "micro-batches", self.opts.progress_every_s)
        """Progress within a round, as the plain worker reports it (the launcher shows the slowest device's)."""

    # --- the loop -------------------------------------------------------------------------------
    def train(self) -> None:
        self._connect()
        # Split backwards (I/W) need nothing of their own here: every W of a round runs before its
        # AR, so snapshots and backups, taken after the round's STEP, never miss a deferred weight
        # gradient, and an interrupted round's executor (with the graphs its pending Ws hold) is
        # dropped by the rebuild that every re-plan makes.
        self.executor = self.w.new_executor(self.comm)
        self.executor.on_step = self.steps.report
        r = self.opts.start_round
        self._protect(r)
        meta_model(self.w.config.model)  # built now rather than in the middle of a recovery
        self.store.set(wire.ready(self.device), "1")  # the coordinator arms failure detection once all are
        reconfigure = False
        while True:
            try:
                if reconfigure:  # itself interrupted when another device is lost meanwhile
                    r, reconfigure = self._reconfigure(), False
                elif r < self.opts.rounds:
                    r = self._one_round(r)
                elif self._finish():
                    return
            except Exception as e:
                if self.beats.orphaned.is_set():
                    raise self._orphaned() from None
                if not (_recoverable(e) or self.beats.interrupt.is_set()):
                    raise
                if not isinstance(e, Interrupted):  # the cause, in the last lines a failure shows
                    print(f"{self.device}: {e.__class__.__name__}: {str(e)[:300]}; waiting for a re-plan",
                          file=sys.stderr, flush=True)
                reconfigure = True

    def _one_round(self, r: int) -> int:
        stats = self.w.run_round(self.executor, r)
        self.previous = None  # a round completed in this layout: every worker has left the previous one
        completed = r + 1
        self.backup_bytes, self.backup_s = 0, 0.0
        if completed % self.rc.replicate_every == 0 or completed == self.opts.rounds:
            self._protect(completed)
        phases = {**self.phases, "replayed_round": round(stats.duration_s, 4)} if self.phases else {}
        self.phases = {}
        self.w.publish_round(stats, generation=self.generation, backup_bytes=self.backup_bytes,
                             backup_s=self.backup_s, recovery_phases=phases)
        self.beats.round = completed
        self.beats.samples_per_s = self.w.topo.global_batch / stats.duration_s if stats.duration_s > 0 else 0.0
        return completed

    def _finish(self) -> bool:
        """Hand in the final state once; then wait for the coordinator's `end` (True) or an interruption."""
        if not self._finished:
            self._wait_sends()  # the last backups must be on their holders before anyone may leave the group
            if not self.kept.backups.settle(self.beats.interrupt):
                raise Interrupted("interrupted while the last backups arrived")
            self.w.publish_final()
            self.store.set(wire.finished(self.generation, self.device), "1")
            self._finished = True
        while not self.store.check([wire.end()]):
            if self.beats.interrupt.is_set():
                raise Interrupted("interrupted after the last round")
            time.sleep(0.05)
        return True

    # --- replication ------------------------------------------------------------------------------
    def _protect(self, completed: int) -> None:
        """Snapshot this stage after `completed` rounds; exchange backups along the stage ring."""
        begin = time.perf_counter()
        state = stage_state(self.w.stage, self.w.optimizer)
        self.kept.snapshots.add(completed, state)
        self._wait_sends()
        target = self.targets.get(self.device)
        if target:
            data = to_bytes(state)
            self._sends = send_bytes(self.state_comm, data, target)
            self.backup_bytes += len(data)
        for source in sorted(d for d, t in self.targets.items() if t == self.device):
            self.kept.backups.receive_later(self.state_comm, source, completed)
        self.backup_s += time.perf_counter() - begin

    def _wait_sends(self) -> None:
        """Wait for this worker's previous backup to leave (interruptible)."""
        for work, _ in self._sends:
            work.wait()
        self._sends = []

    # --- process groups and executor -------------------------------------------------------------
    def _connect(self) -> None:
        topo = self.w.topo
        store = self.store if self.generation == 0 else prefixed(self.store, wire.generation_prefix(self.generation))
        ranks = {d: topo.rank(d) for d in topo.devices}
        for i, helper in enumerate(self.helpers):
            ranks[helper] = topo.world_size + i
        stage = topo.stage_of.get(self.device, -1)
        # A re-plan's group is formed by members that have all come for it (`_await_members`): seconds
        # at most. One that dies meanwhile would hold the others in gloo's rendezvous, which cannot be
        # abandoned, for the run's whole --timeout; bounded, they take the coordinator's next re-plan.
        bound = None if self.generation == 0 else min(self.opts.timeout_s, self.regroup_timeout_s)
        try:
            groups = bootstrap.init_process_groups(
                store, ranks[self.device], topo.world_size + len(self.helpers),
                [topo.group_ranks(p) for p in range(topo.num_stages)], stage,
                store_host=self.w.config.store_host, timeout_s=self.opts.timeout_s, connect_timeout_s=bound)
            # Backups get process group (and TCP connections) of their own: on the pipeline's connection
            # a stage's backup, megabytes posted at the end of a round, held up the next round's
            # activations to the same neighbour until all of it had gone (head-of-line blocking: the
            # Env D lab ran at half the speed of the same plan without fault tolerance). On its own
            # connection it shares the link with them instead.
            state_group = bootstrap.new_world_group(self.opts.timeout_s, connect_timeout_s=bound)
        except Exception as e:
            if bound is None:
                raise
            bootstrap.abandon_process_groups(RETIRED_GROUPS)  # what formed, and torch's group numbering
            raise Interrupted(f"{self.device}: the group of re-plan {self.generation} did not form within "
                              f"{bound:.0f} s (a member lost meanwhile?)") from e
        self.comm = AbortableComm(ranks, groups, self.beats.interrupt)
        self.state_comm = AbortableComm(ranks, groups, self.beats.interrupt, p2p_group=state_group)
        from hppctl.planner.replan import backup_targets

        self.targets = backup_targets(self.w.config.schedule)

    @property
    def regroup_timeout_s(self) -> float:
        """How long a re-plan's group may take to form: well past the coordinator's detection of a
        member that died meanwhile (failure timeout and probe), so that its next re-plan is out."""
        return max(10.0, 3 * self.rc.timeout_s)

    def _retire_group(self) -> None:
        """Leave the old group: keep references (destroying it would wait for operations stuck on the lost
        device) and drop it from torch's registry so a new default group can be made."""
        import torch.distributed as dist

        if dist.is_initialized():
            RETIRED_GROUPS.append((self.comm.groups.stage_group, self.state_comm.p2p_group, self._sends))
        bootstrap.abandon_process_groups(RETIRED_GROUPS)
        self._sends = []

    # --- reconfiguration --------------------------------------------------------------------------
    def _reconfigure(self) -> int:
        clock = _PhaseClock()
        generation = self.beats.wait_generation(self.rc.stall_timeout_s)
        if generation is None:
            if self.beats.orphaned.is_set():
                raise self._orphaned()
            raise RuntimeFailure(f"{self.device}: a peer failed and the coordinator did not re-plan within "
                                 f"{self.rc.stall_timeout_s:.0f} s")
        clock.lap("stop")
        self._retire_group()
        self.w.optimizer.zero_grad(set_to_none=True)
        inventory = self.kept.inventory(self.previous.inventory() if self.previous is not None else None)
        while True:  # a further generation: another device was lost before the new configuration came
            self.store.set(wire.stall(generation, self.device), inventory.model_dump_json())
            key = self._wait_key([wire.gather(generation), wire.reconf(generation)], generation)
            if key == wire.gather(generation):
                clock.lap("wait_gather")
                self._upload(generation, GatherPlan.model_validate_json(self.store.get(key)))
                clock.lap("upload")
                key = self._wait_key([wire.reconf(generation)], generation)
            if key is not None:
                break
            generation = self.beats.coordinator_generation
        clock.lap("wait_plan")
        resume = self._apply(generation, Reconfiguration.model_validate_json(self.store.get(key)), clock)
        self.phases = clock.phases
        return resume

    def _wait_key(self, keys: list[str], generation: int) -> str | None:
        """The first of `keys` to appear; None when the coordinator moves past `generation` meanwhile."""
        found: list[str] = []

        def appeared() -> bool:
            found.extend(key for key in keys if self.store.check([key]))
            return bool(found)

        return found[0] if self._wait_until(appeared, generation, "no new configuration") else None

    def _wait_until(self, done, generation: int, failure: str) -> bool:
        """Poll `done` until it holds (True) or the coordinator moves past `generation` (False: another
        device was lost meanwhile); an orphaned worker stops, and `failure` is reported after the stall
        timeout."""
        deadline = time.monotonic() + self.rc.stall_timeout_s
        while time.monotonic() < deadline:
            if done():
                return True
            if self.beats.coordinator_generation > generation:
                return False
            if self.beats.orphaned.is_set():
                raise self._orphaned()
            time.sleep(0.02)
        raise RuntimeFailure(f"{self.device}: {failure} within {self.rc.stall_timeout_s:.0f} s")

    def _orphaned(self) -> "Orphaned":
        return Orphaned(f"no word from the coordinator for {self.beats.orphan_after_s:.1f} s")

    def _kept_in(self, layout: int) -> "Kept":
        """What this worker kept in `layout` (the coordinator re-plans from a layout every survivor holds)."""
        for kept in (self.kept, self.previous):
            if kept is not None and kept.layout == layout:
                return kept
        raise RuntimeFailure(f"{self.device}: asked to restore layout {layout}, which it no longer holds")

    def _upload(self, generation: int, doc: GatherPlan) -> None:
        """Heavy re-planning: send whole old stages to the coordinator."""
        from hppctl.runtime.bootstrap import put_blob

        for stage, source in doc.uploads.items():
            if source.device == self.device:
                state = self._kept_in(doc.layout).state_at(doc.resume_round, source.backup_of)
                put_blob(self.store, wire.heavy_old(generation, int(stage)), to_bytes(state))

    def _apply(self, generation: int, doc: Reconfiguration, clock: "_PhaseClock") -> int:
        from hppctl.runtime.topology import Topology

        resume = doc.resume_round
        schedule = doc.schedule
        topo = Topology.of(schedule)
        self.generation = generation
        self.helpers = list(doc.helpers)
        if self.device not in topo.devices and self.device not in self.helpers:
            raise Dismissed()
        base = self._kept_in(doc.layout)
        self.beats.generation = generation  # first, so that the acknowledgements stop interrupting
        self.beats.interrupt.clear()
        self.w.follow(schedule)
        self._await_members(generation, list(topo.devices) + self.helpers)
        self._connect()
        clock.lap("regroup")
        if self.device not in topo.devices:  # a leaver: hand the layers over, then go
            self._migrate(doc, base, frozenset())
            self._await_hand_over(generation, list(topo.devices))
            raise Dismissed()
        names = layer_names(self.w.config.model, self.w.config.granularity, *schedule.stages[self.w.stage_index].layers)
        if doc.method == "heavy":
            state = from_bytes(bootstrap.get_blob(self.store, wire.heavy_new(generation, self.w.stage_index)))
        else:
            state = self._migrate(doc, base, names)
        if self.helpers:  # the leavers among them wait for this before they go (`_await_hand_over`)
            self.store.set(wire.moved(generation, self.device), "1")
        clock.lap("move")
        self._rebuild(state)
        clock.lap("rebuild")
        self.kept, self.previous = Kept(generation, Snapshots(), Backups()), base
        self.beats.round = resume
        self._finished = False
        self._protect(resume)
        clock.lap("backup")
        return resume

    def _await_members(self, generation: int, members: list[str]) -> None:
        """Wait, interruptibly, until every member of the new group has come for it. gloo's rendezvous
        cannot be abandoned: entered while a member is already gone, it waits out the run's whole
        timeout (minutes) instead of reporting to the coordinator, which re-plans again."""
        self.store.set(wire.arrived(generation, self.device), "1")
        self._await_everyone(generation, wire.arrived, members, "the new group did not form",
                             "another device was lost before the new group formed")

    def _await_hand_over(self, generation: int, members: list[str]) -> None:
        """A leaver goes only once every member of the new layout has formed the groups and taken its
        layers. Gone as soon as its sends were on the socket, it closed connections that a CPU-starved
        member was still setting up ("Gloo connectFullMesh failed ... Connection closed by peer"), and
        that member waited for a re-plan that never came (2 SIGTERM runs in 97 under two CPU hogs;
        docs/fault-tolerance.md, "Graceful leave")."""
        self._await_everyone(generation, wire.moved, members, "the new layout did not take the layers",
                             "another device was lost while this one handed its layers over")

    def _await_everyone(self, generation: int, key, members: list[str], failure: str, lost: str) -> None:
        """Until every member has set `key(generation, member)`; Interrupted(`lost`) when the
        coordinator moves past `generation` meanwhile."""
        keys = [key(generation, d) for d in members]
        if not self._wait_until(lambda: self.store.check(keys), generation, failure):
            raise Interrupted(lost)

    def _migrate(self, doc: Reconfiguration, base: "Kept", names: frozenset[str]) -> dict:
        """Light re-planning: only the layers that change owner move, all transfers posted at once."""
        model, granularity = self.w.config.model, self.w.config.granularity
        own = base.snapshots.states.get(doc.resume_round)
        sends, parts = [], [subset(own, names)] if own is not None else []
        for m in doc.migrations:
            if m.source == self.device:
                state = own if not m.backup_of else base.state_at(doc.resume_round, m.backup_of)
                part = subset(state, layer_names(model, granularity, m.start, m.end))
                if m.device == self.device:  # the backup holder takes over the lost layers itself
                    parts.append(part)
                else:
                    sends += send_bytes(self.comm, to_bytes(part), m.device)
        for m in doc.migrations:
            if m.device == self.device and m.source != self.device:
                parts.append(from_bytes(recv_bytes(self.comm, m.source)))
        for work, _ in sends:
            work.wait()
        return subset(merge(parts), names)

    def _rebuild(self, state: dict) -> None:
        """This device's stage in the new schedule, built as the plain worker builds it, from `state`."""
        config = self.w.config
        built = build_training_state(config, config.schedule, self.w.stage_index, state["tensors"], self.w.feed)
        restore_optimizer(built.optimizer, built.stage, state["optim"])
        self.w.adopt(built)
        self.executor = self.w.new_executor(self.comm)
        self.executor.on_step = self.steps.report


@dataclass
class Kept:
    """A worker's snapshots and the backups it holds, all in the layout of generation `layout`."""

    layout: int
    snapshots: Snapshots
    backups: Backups

    def inventory(self, previous: Inventory | None = None) -> Inventory:
        """What the coordinator needs to choose a resume round (ft/replay.py), and the bytes of
        every name in each state it holds, by round (`replay.migration_bytes`: what a light re-plan moves)."""
        sizes = StateSizes(own={str(r): state_bytes(s) for r, s in self.snapshots.states.items()},
                           backups=self.backups.state_bytes())
        return Inventory(layout=self.layout, snapshots=self.snapshots.rounds(), backups=self.backups.inventory(),
                         state_bytes=sizes, previous=previous)

    def state_at(self, round_index: int, backup_of: str | None) -> dict:
        """This worker's own state after `round_index` rounds, or the backup it holds of `backup_of`'s."""
        if backup_of:
            return from_bytes(self.backups.get(backup_of, round_index))
        return self.snapshots.states[round_index]


class _PhaseClock:
    """Seconds spent in each named step of a reconfiguration, in order."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = round(self.phases.get(name, 0.0) + now - self._last, 4)
        self._last = now


def run_ft(config: WorkerConfig, token: str, make_worker) -> int:
    """`run_worker` for a run with a coordinator: join, train across re-plans, report; the exit code.
    `make_worker(config, store)` builds the training state (runtime/worker.py's `Worker`)."""
    rc, links = config.recovery, []

    def start_links(ctx: WorkerContext) -> None:
        """Heartbeats and probe answers from before the join; SIGTERM becomes a graceful leave."""
        source = "127.0.0.1" if rc.coordinator_host.startswith("127.") else bootstrap.route_source(rc.coordinator_host)
        probes = ProbeResponder(source, token, config.device).start()
        beats = HeartbeatSender(config.device, token, (rc.coordinator_host, rc.coordinator_port), source=source,
                                period_s=rc.heartbeat_s, orphan_after_s=1.5 * rc.timeout_s, probe_port=probes.port)
        links.extend([probes, beats.start()])
        signal.signal(signal.SIGTERM, lambda signum, frame: leave(beats))

    def body(ctx: WorkerContext) -> int | None:
        try:
            FtRun(make_worker(ctx.config, ctx.store), ctx.store, links[-1]).train()
        except Dismissed:
            return 0  # no `done/`: the coordinator took this device out of the run
        except Orphaned as e:
            print(f"{config.device}: {e}; stopping (the checkpoint directory holds complete rounds only)",
                  file=sys.stderr, flush=True)
            return 1
        return None

    code = run_worker_process(config, token, body, before_join=start_links)
    for link in links:
        link.stop()
    if RETIRED_GROUPS:
        # An abandoned group's destructor joins threads stuck on the lost device until gloo's timeout:
        # leave without running destructors (the store and the coordinator already have everything).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def leave(beats: HeartbeatSender) -> None:
    """SIGTERM: say `leave` at once; the coordinator re-plans and this worker hands its layers over."""
    beats.leaving = True
    beats.beat_now()
