"""Probe output -> profile pieces. PURE: text and records in, typed data out (no torch, no I/O).

Tested on captured probe outputs in tests/data/profiling/. The numbers a measured profile
carries, and how they are derived from the raw samples, are defined here:

- a layer's time at a batch size = median of its repeats x the device's sustained factor at that
  batch size; its spread = (q3 - q1) / median of the repeats; its weight-gradient time the same
  of its passes' weight-gradient parts (at most its backward);
- sustained factor, from the whole steps run back to back: one thread, where the clock is CPU
  time: their wall seconds / their CPU seconds, how much longer than its CPU time work takes on
  this device (1/quota on a CFS-throttled one, more when other processes compete for the core);
  several threads, where the clock is wall time: mean step wall time / median;
- a whole step's time (`train_step_s`) = sustained wall seconds per step;
- a link's planner bandwidth = the slower direction's goodput (the pipeline sends activations
  one way and gradients the other).
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from hppctl.models.profile import AcceleratorProfile, DeviceProfile, LinkProfile, MeasurementInfo
from hppctl.profiling.records import Batch, Identity, Memory, Pass, Ping, Received, Setup, Skip, Step


class ProbeOutputError(ValueError):
    """A probe printed something this version cannot read."""


def records(text: str) -> list[dict[str, Any]]:
    """The JSON objects a probe printed, one per line; other lines (warnings) are ignored."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and "type" in value:
            found.append(value)
    return found


def first(found: Iterable[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((r for r in found if r.get("type") == kind), None)


def error_of(found: Sequence[dict[str, Any]]) -> str | None:
    record = first(found, "error")
    return str(record.get("error")) if record else None


def last_progress(found: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    progress = [r for r in found if r.get("type") == "progress"]
    return progress[-1] if progress else None


def typed(record: dict[str, Any], model):
    """Validate one record; a mismatch is a ProbeOutputError naming the record type and field."""
    from pydantic import ValidationError

    try:
        return model.model_validate(record)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ProbeOutputError(f"probe record {record.get('type')!r}: {where}: {err['msg']}") from None


def parse_version(text: str) -> str | None:
    """'hppctl 0.1.0' -> '0.1.0' (None when the output is not hppctl's version line)."""
    for line in text.strip().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "hppctl":
            return parts[1]
    return None


# ---------------------------------------------------------------------------------------------
# identity and fingerprint
# ---------------------------------------------------------------------------------------------


def fingerprint(identity: Identity, host_key: str | None = None) -> str:
    """What makes measurements of this device reusable: the same machine, the same share of it, the
    same software. A quota read from cgroup files is exact and included; a measured one is not (a busy
    machine pulls it down: a 1-core lab host has read 0.40 while other labs ran), only the threads it
    implies. `host_key` (the SSH host key) tells a re-created device from the old one of the same name:
    an edge lab built again may give its hosts other quotas."""
    exact_quota = identity.cpu_quota_source.startswith("cgroup")
    doc = {
        "hostname": identity.hostname, "machine": identity.machine, "cpu_model": identity.cpu_model,
        "cpus": identity.cpus, "threads": identity.threads,
        "quota": identity.cpu_quota_cores if exact_quota else None,
        "memory": identity.memory_limit_bytes or identity.memory_total_bytes,
        "python": identity.python, "torch": identity.torch, "transformers": identity.transformers,
        "hppctl": identity.hppctl, "host_key": host_key,
    }
    if identity.accelerator is not None and identity.accelerator.type != "cpu":  # a CPU's fingerprint as before
        doc["accelerator"] = [identity.accelerator.type, identity.accelerator.name, identity.accelerator.memory_bytes]
    text = json.dumps(doc, sort_keys=True)
    return "dev-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def memory_budget(identity: Identity, runtime_bytes: int, inventory_bytes: int | None) -> tuple[int, str, int | None]:
    """(budget for training tensors, where it came from, the measured limit).

    The inventory's `memory:` is the budget as given. Otherwise the cgroup limit (or
    MemAvailable when there is none) minus what a worker process costs before any tensor. On a
    CUDA device the tensors live in GPU memory: the budget is the GPU's memory as CUDA reports it;
    with unified memory (an integrated GPU, a Jetson) CPU and GPU draw on the same RAM, so it is the
    smaller of the GPU-visible memory and the host budget above (the worker's runtime is host RAM too).
    """
    measured = identity.memory_limit_bytes or identity.memory_available_bytes or identity.memory_total_bytes
    if inventory_bytes is not None:
        return inventory_bytes, "inventory", measured
    if not measured:
        raise ProbeOutputError("the device reported neither a memory limit nor MemAvailable")
    source = "cgroup limit" if identity.memory_limit_bytes else "MemAvailable"
    host = max(1, measured - runtime_bytes)
    gpu = identity.accelerator
    if gpu is not None and gpu.type == "cuda" and gpu.memory_bytes:
        if gpu.integrated:
            return (min(gpu.memory_bytes, host), f"unified memory: min(GPU-visible {gpu.memory_bytes} B, "
                    f"{source} minus the worker's runtime)", gpu.memory_bytes)
        return gpu.memory_bytes, f"CUDA memory of {gpu.name}", gpu.memory_bytes
    return host, f"{source} minus the worker's runtime", measured


# ---------------------------------------------------------------------------------------------
# device profile
# ---------------------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def spread(values: Sequence[float]) -> float:
    """(q3 - q1) / median; 0 for fewer than two values or a zero median."""
    if len(values) < 2:
        return 0.0
    mid = median(values)
    if mid <= 0:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / mid


def sustained_factor(batch: Batch) -> float:
    """Wall time / clock time of the whole steps (module docstring)."""
    if batch.clock == "cpu":
        return batch.step.wall_s / batch.step.cpu_s if batch.step.cpu_s > 0 else 1.0
    step_clock = median(batch.step.clock_s)
    return (batch.step.wall_s / batch.step.count) / step_clock if step_clock > 0 else 1.0


STAGE_CALL_FLOOR = 0.1
"""A layer keeps at least this share of its timed forward: a call cost measured once, on a busy
machine, must not erase a short layer."""


def without_stage_call(seconds: float, stage_call_s: float) -> float:
    """A layer's forward as a runtime stage runs it: without the call of its own one-layer stage."""
    return max(seconds - stage_call_s, STAGE_CALL_FLOOR * seconds)


def device_profile(name: str, identity: Identity, setup: Setup, batches: Sequence[Batch], *,
                   memory_bytes: int | None, repeats: int, warmup: int, notes: Sequence[str] = (),
                   device_fingerprint: str | None = None) -> DeviceProfile:
    """One measured device from its identity, its setup record and one `Batch` per batch size."""
    if not batches:
        raise ProbeOutputError(f"device {name}: no batch size was measured")
    batches = sorted(batches, key=lambda b: b.batch_size)
    for b in batches:
        if len(b.forward) != setup.layers or len(b.backward) != setup.layers:
            raise ProbeOutputError(f"device {name}: batch {b.batch_size} has {len(b.forward)} layers, "
                                   f"setup says {setup.layers}")
    factors = [sustained_factor(b) for b in batches]
    forward = [[without_stage_call(median(b.forward[i]), setup.stage_call_s) * f for b, f in zip(batches, factors)]
               for i in range(setup.layers)]
    backward = [[median(b.backward[i]) * f for b, f in zip(batches, factors)] for i in range(setup.layers)]
    weight_grad = weight_grad_times(batches, factors, backward)
    budget, budget_source, measured = memory_budget(identity, setup.runtime_bytes, memory_bytes)
    optimizer = [s for b in batches for s in b.optimizer_step_s]
    all_notes = list(notes) + [n for b in batches for n in b.notes]
    info = MeasurementInfo(
        hostname=identity.hostname, cpu_model=identity.cpu_model, cpus=identity.cpus,
        cpu_quota_cores=identity.cpu_quota_cores, cpu_quota_source=identity.cpu_quota_source,
        threads=setup.threads, clock=setup.clock, repeats=repeats, warmup=warmup,
        sustained_factor=factors, step_clock_s=[median(b.step.clock_s) for b in batches],
        optimizer_step_s=median(optimizer) if optimizer else None, stage_call_s=setup.stage_call_s,
        memory_budget_source=budget_source, memory_measured_bytes=measured,
        fingerprint=device_fingerprint or fingerprint(identity),
        python=identity.python, torch=identity.torch, hppctl=identity.hppctl, notes=all_notes,
    )
    gpu = identity.accelerator
    accelerator = (AcceleratorProfile(type=gpu.type, name=gpu.name, memory_bytes=gpu.memory_bytes,
                                      integrated=gpu.integrated)
                   if gpu is not None and gpu.type != "cpu" else None)
    return DeviceProfile(
        name=name, kind=f"measured:{identity.hostname}", memory_bytes=budget, accelerator=accelerator,
        batch_sizes=[b.batch_size for b in batches], forward_s=forward, backward_s=backward,
        weight_grad_s=weight_grad, source="measured",
        forward_spread=[[spread(b.forward[i]) for b in batches] for i in range(setup.layers)],
        backward_spread=[[spread(b.backward[i]) for b in batches] for i in range(setup.layers)],
        train_step_s=[b.step.wall_s / b.step.count for b in batches],
        train_peak_bytes=[b.peak_bytes for b in batches], runtime_bytes=setup.runtime_bytes, measurement=info,
    )


def weight_grad_times(batches: Sequence[Batch], factors: Sequence[float],
                      backward: Sequence[Sequence[float]]) -> list[list[float]] | None:
    """Each layer's weight-gradient seconds at each batch size: the median of its passes' values x the
    sustained factor, as its backward; never more than that backward (a pass's value is already at
    most its pass's backward, so only rounding could). None when a batch size lacks them (passes of
    an older probe): a profile splits every backward or none."""
    if any(b.weight_grad is None for b in batches):
        return None
    return [[min(median(b.weight_grad[i]) * f, backward[i][k]) for k, (b, f) in enumerate(zip(batches, factors))]
            for i in range(len(backward))]


def train_output(found: Sequence[dict[str, Any]]) -> tuple[Setup | None, list[Memory], list[Pass], list[Skip]]:
    """The setup, memory, pass and skip records of a `train` probe's output."""
    setup = first(found, "setup")
    return (typed(setup, Setup) if setup else None,
            [typed(r, Memory) for r in found if r.get("type") == "memory"],
            [typed(r, Pass) for r in found if r.get("type") == "pass"],
            [typed(r, Skip) for r in found if r.get("type") == "skip"])


def assemble_batch(setup: Setup, memory: Memory, passes: Sequence[Pass]) -> Batch:
    """One batch size's `Batch` from its memory record and its timed passes."""
    if not passes:
        raise ProbeOutputError(f"batch {memory.batch_size}: no timed pass")
    for p in passes:
        widths = {len(p.forward), len(p.backward), len(p.weight_grad if p.weight_grad is not None else p.backward)}
        if p.batch_size != memory.batch_size or widths != {setup.layers}:
            raise ProbeOutputError(f"batch {memory.batch_size}: a pass for batch {p.batch_size} with "
                                   f"{'/'.join(map(str, sorted(widths)))} layers (setup says {setup.layers})")
    step = Step(count=sum(p.step.count for p in passes), wall_s=sum(p.step.wall_s for p in passes),
                cpu_s=sum(p.step.cpu_s for p in passes), clock_s=[s for p in passes for s in p.step.clock_s])
    split = all(p.weight_grad is not None for p in passes)
    return Batch(batch_size=memory.batch_size, clock=setup.clock,
                 forward=[[p.forward[i] for p in passes] for i in range(setup.layers)],
                 backward=[[p.backward[i] for p in passes] for i in range(setup.layers)],
                 weight_grad=[[p.weight_grad[i] for p in passes] for i in range(setup.layers)] if split else None,
                 step=step, optimizer_step_s=memory.optimizer_step_s, peak_bytes=memory.peak_bytes,
                 peak_method=memory.peak_method, notes=memory.notes)


def batches_from_output(found: Sequence[dict[str, Any]]) -> tuple[Setup, list[Batch], list[Skip]]:
    """A whole `train` output (e.g. a captured one) as batches, one per batch size with passes."""
    setup, memories, passes, skips = train_output(found)
    if setup is None:
        raise ProbeOutputError(error_of(found) or "the training probe printed no setup record")
    batches = []
    for memory in memories:
        mine = [p for p in passes if p.batch_size == memory.batch_size]
        if mine:
            batches.append(assemble_batch(setup, memory, mine))
    return setup, batches, skips


# ---------------------------------------------------------------------------------------------
# links
# ---------------------------------------------------------------------------------------------


def link_profile(a: str, b: str, a_to_b: Received, b_to_a: Received, ping: Ping | None) -> LinkProfile:
    """A measured link: both directions' goodput, the slower one for the planner, median RTT."""
    rates = [a_to_b.bytes_per_s, b_to_a.bytes_per_s]
    if min(rates) <= 0:
        raise ProbeOutputError(f"link {a}-{b}: no bytes arrived ({a_to_b.bytes} and {b_to_a.bytes} bytes)")
    return LinkProfile(between=[a, b], bytes_per_s=min(rates), directed_bytes_per_s=rates,
                       rtt_s=median(ping.rtt_s) if ping else None, source="measured")


def received(found: Sequence[dict[str, Any]]) -> Received:
    record = first(found, "recv")
    if record is None:
        raise ProbeOutputError(error_of(found) or "the receiver printed no result")
    return typed(record, Received)


def pinged(found: Sequence[dict[str, Any]]) -> Ping:
    record = first(found, "ping")
    if record is None:
        raise ProbeOutputError(error_of(found) or "the ping client printed no result")
    return typed(record, Ping)


# ---------------------------------------------------------------------------------------------
# failures
# ---------------------------------------------------------------------------------------------

KILLED_EXITS = (137, -9)
"""SIGKILL as a shell reports it (128 + 9), and as SSH reports a signal (fabric/invoke: -1 or -9)."""


def exit_reason(kind: str, exit_code: int, stderr: str, found: Sequence[dict[str, Any]],
                memory_limit: int | None = None) -> str:
    """Why a probe run failed, in one line, from its exit code, stderr and the records it printed."""
    error = error_of(found)
    if error:
        return error
    tail = next((line.strip() for line in reversed(stderr.strip().splitlines()) if line.strip()), "")
    progress = last_progress(found)
    where = ""
    if progress is not None and progress.get("batch_size"):
        where = f" at batch {progress['batch_size']} ({progress.get('phase')})"
    if exit_code in KILLED_EXITS or (exit_code == -1 and not tail):
        limit = f", memory limit {memory_limit / 1e6:.0f} MB" if memory_limit else ""
        return f"probe {kind!r} was killed{where} (SIGKILL: out of memory?{limit})"
    if "No module named hppctl" in stderr or "No module named 'hppctl" in stderr:
        return "hppctl is not installed for the device's python (use --install)"
    if exit_code == 127:
        return f"command not found on the device: {tail}"
    return f"probe {kind!r} exited with {exit_code}{where}: {tail or 'no output'}"
