"""What-if of a device failure (`hppctl simulate --fail DEVICE[,DEVICE...]@SECONDS`): the recovery timeline.

Training runs round after round at the plan's simulated round latency. At `at_s` the device (or
several together: a power strip, a switch) dies. The model of what follows mirrors Asteroid's
pipeline replay (§3.4) as hppctl runs it (devices lost together are dropped by one re-plan):

1. detection: for a `silent` failure (a hung device, a cut link, a power loss) the coordinator
   hears nothing for `timeout_s` after the last heartbeat, then a probe waits `probe_s`
   (heartbeats every `heartbeat_s`); a `crash` (the worker process dies, its host lives on) closes
   the worker's connections and ends its process, which the launcher sees at once (measured
   0.07-0.15 s on the lab; modelled as 0);
2. re-planning: the light or heavy planner runs (its real time on this machine is measured);
3. state movement: light — every device fetches only the layers that change owner, all
   migrations concurrently, each at its link's bandwidth (the slowest one decides), the lost
   stage's layers from its backup holder; heavy — every old stage's weights and optimizer state go
   to the coordinator (the first survivor) from a survivor of it, or for a lost stage from its
   backup holder, and every survivor receives its new stage back;
4. the survivors rebuild their process group (`regroup_s`);
5. the interrupted round is replayed from its start on the new plan: the first round after the
   failure completes one (new) round latency later.

Rounds before and after carry the replication that makes recovery possible (`replicate_every` K,
as `hppctl run --replicate-every`): every K rounds each single-device stage sends its weights and
optimizer state to its backup holder. The bytes arrive in the background, so they cost no compute,
but they share the sender's uplink with its activations and gradients: a round lasts at least as
long as the busiest uplink's traffic (`round_with_replication`). On the Env D lab with MobileNetV2
that is what bounds the round, not compute (docs/fault-tolerance.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection
from dataclasses import dataclass

from hppctl.errors import Infeasible, RuntimeFailure
from hppctl.models.plan import HppPlan
from hppctl.models.profile import Profile


FAILURE_KINDS = ("silent", "crash")


@dataclass(frozen=True)
class Recovery:
    method: str  # light, or heavy (also when light fell back to heavy)
    requested: str
    failed_device: str
    """The device that fails, or several joined by ", " (they fail together)."""
    fail_at_s: float
    detected_at_s: float
    replan_s: float
    moved_bytes: int
    move_s: float
    resumed_at_s: float
    first_round_done_at_s: float
    round_latency_before_s: float
    round_latency_after_s: float
    throughput_before: float
    throughput_after: float
    lost_work_s: float
    backup_link_s_before: float
    """Per round, the busiest uplink's seconds of backup traffic (amortised over K rounds)."""
    stages_after: int
    devices_after: list[str]
    kind: str = "silent"
    """silent or crash (FAILURE_KINDS): how the failure is detected."""

    @property
    def detection_s(self) -> float:
        return self.detected_at_s - self.fail_at_s

    @property
    def recovery_s(self) -> float:
        """Failure to the first round completed afterwards."""
        return self.first_round_done_at_s - self.fail_at_s


def optimizer_factor(profile: Profile) -> float:
    """Bytes moved per parameter byte: the weights plus the optimizer state."""
    return 1.0 + profile.optimizer_state_factor


def simulate_failure(plan: HppPlan, profile: Profile, device: str | Collection[str], at_s: float, *,
                     method: str = "light", heartbeat_s: float = 1.0, timeout_s: float = 3.0, probe_s: float = 2.0,
                     regroup_s: float = 1.0, replicate_every: int = 1, kind: str = "silent") -> Recovery:
    """Infeasible when the devices take layers with them: a stage's device with its backup holder,
    or every replica of a stage (the run would stop; ft/replay.py)."""
    from hppctl.ft.replay import upload_plan
    from hppctl.planner.replan import lost_devices, replan_heavy, replan_light
    from hppctl.schedule import simulate_plan

    lost = lost_devices(device)
    try:
        upload_plan(plan, lost)  # every old stage has a surviving holder of its state
    except RuntimeFailure as e:
        raise Infeasible(f"losing {', '.join(lost)} loses state: {e}") from None

    before = round_with_replication(plan, profile, simulate_plan(plan, profile)[1].round_latency_s,
                                    replicate_every)
    if kind not in FAILURE_KINDS:
        raise ValueError(f"failure kind {kind!r} (known: {', '.join(FAILURE_KINDS)})")
    last_beat = math.floor(at_s / heartbeat_s) * heartbeat_s
    detected = max(at_s, last_beat + timeout_s) + probe_s if kind == "silent" else at_s
    started = time.perf_counter()
    result = (replan_light if method == "light" else replan_heavy)(plan, profile, lost)
    replan_s = time.perf_counter() - started
    moved, move_s = _movement(plan, profile, result, lost)
    resumed = detected + replan_s + move_s + regroup_s
    after = round_with_replication(result.plan, result.profile,
                                   simulate_plan(result.plan, result.profile)[1].round_latency_s, replicate_every)
    round_start = math.floor(at_s / before) * before
    return Recovery(
        method=result.method, requested=method, failed_device=", ".join(lost), fail_at_s=at_s, detected_at_s=detected,
        replan_s=replan_s, moved_bytes=moved, move_s=move_s, resumed_at_s=resumed,
        first_round_done_at_s=resumed + after, round_latency_before_s=before, round_latency_after_s=after,
        throughput_before=plan.global_batch / before, throughput_after=plan.global_batch / after,
        lost_work_s=at_s - round_start,
        backup_link_s_before=max(backup_link_s(plan, profile, replicate_every).values(), default=0.0),
        stages_after=len(result.plan.stages), devices_after=result.plan.devices(), kind=kind,
    )


@dataclass(frozen=True)
class Backup:
    """What one single-device stage sends to its backup holder every `replicate_every` rounds."""

    sender: str
    holder: str
    bytes: float
    """The stage's weights and optimizer state."""


def backups(plan: HppPlan, profile: Profile) -> list[Backup]:
    """Every backup a round with replication sends (replicated stages need none)."""
    factor = optimizer_factor(profile)
    out = []
    for sender, holder in _backup_holders(plan).items():
        if holder is None:
            continue
        stage = next(st for st in plan.stages if sender in st.devices)
        size = factor * sum(layer.param_bytes for layer in profile.layers[stage.start:stage.end])
        out.append(Backup(sender, holder, size))
    return out


def backup_link_s(plan: HppPlan, profile: Profile, replicate_every: int) -> dict[str, float]:
    """Per backup sender, the seconds per round its uplink spends on its backup (every K rounds)."""
    if replicate_every <= 0:
        return {}
    return {b.sender: b.bytes / profile.bandwidth_between(b.sender, b.holder) / replicate_every
            for b in backups(plan, profile)}


def round_with_replication(plan: HppPlan, profile: Profile, latency_s: float, replicate_every: int) -> float:
    """The round latency once backups share the uplinks: at least every device's uplink traffic per
    round (its activations forward, its gradients backward, its backup). `replicate_every` 0: none."""
    backups = backup_link_s(plan, profile, replicate_every)
    if not backups:
        return latency_s
    M = plan.num_micro_batches
    transfers = {t.after_stage: t for t in plan.transfers}
    busiest = latency_s
    for p, stage in enumerate(plan.stages):
        forward = transfers[p].forward_s if p in transfers else 0.0
        backward = transfers[p - 1].backward_s if p - 1 in transfers else 0.0
        for d in stage.devices:
            busiest = max(busiest, M * (forward + backward) + backups.get(d, 0.0))
    return busiest


def _movement(plan: HppPlan, profile: Profile, result, lost: tuple[str, ...]) -> tuple[int, float]:
    layers = profile.layers
    factor = optimizer_factor(profile)

    def layer_bytes(start: int, end: int) -> int:
        return int(factor * sum(layer.param_bytes for layer in layers[start:end]))

    from hppctl.ft.replay import transfer_plan, upload_plan

    if result.method == "light":
        moved, slowest = 0, 0.0
        for t in transfer_plan(plan, result.migrations, lost):  # the lost stages' layers from their backups
            size = layer_bytes(t.start, t.end)
            moved += size
            if t.source != t.device:
                slowest = max(slowest, size / profile.bandwidth_between(t.source, t.device))
        return moved, slowest
    coordinator = result.plan.devices()[0]
    senders = upload_plan(plan, lost)  # one per old stage: a survivor, or a lost stage's backup holder
    gather = sum(layer_bytes(s.start, s.end) / profile.bandwidth_between(senders[str(p)].device, coordinator)
                 for p, s in enumerate(plan.stages) if senders[str(p)].device != coordinator)
    scatter = sum(layer_bytes(s.start, s.end) / profile.bandwidth_between(coordinator, d)
                  for s in result.plan.stages for d in s.devices if d != coordinator)
    total = sum(layer_bytes(s.start, s.end) * len(s.devices) for s in result.plan.stages)
    # the coordinator's one link carries every transfer in turn
    return total, gather + scatter


def _backup_holders(plan: HppPlan) -> dict[str, str | None]:
    from hppctl.planner.replan import backup_targets

    return backup_targets(plan)
