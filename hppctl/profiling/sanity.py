"""Sanity checks of a profile's numbers (docs/profiling.md, "Sanity checks"). Pure: no torch, no I/O.

Two things a measurement gets wrong without failing:

- Implausible times. A training step's time grows with the batch and its time per sample falls
  or stays flat. A measured tiny-mlp profile read 0.662 ms/sample at batch 1, 151 ms/sample at 16
  and 1.2 ms/sample at 256 (a burst of other work on the machine during batch 16): planned on as
  is, such a device looks useless at the batch sizes a plan uses. `implausible_steps` finds them;
  `timing_warnings` is the one line per device `hppctl profile` and `hppctl plan` print.
- Memory counted more than once. Every `local: true` device read this machine's available memory
  as its own budget (19.3 GB × 3 on a 23 GB machine). `share_machine_memory` splits one machine's
  measured memory among the devices on it whose budget was measured (not given as `memory:`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Mapping, Sequence

from hppctl.models.profile import DeviceProfile, Profile
from hppctl.models.units import format_bytes

RISE_FACTOR = 4.0
"""Time per sample rising more than this between two adjacent measured batch sizes is implausible
(cache effects at a larger batch cost well under 2×)."""
FALL_FACTOR = 0.75
"""A whole step at a larger batch taking less than this fraction of one at a smaller batch is
implausible (the margin absorbs the 20–40% noise of a shared machine at tiny batches)."""
STEP_MISMATCH = 4.0
"""A measured device's layer times summing to more than this many times a whole training step timed
in the same rounds, or less than its inverse, are implausible."""
SHOWN_PROBLEMS = 2
"""Phrases a warning line names (the rest are counted): it stays one line on a noisy machine."""


def step_seconds(device: DeviceProfile, index: int) -> float:
    """Forward and backward of every layer at `device.batch_sizes[index]`."""
    return sum(f[index] + b[index] for f, b in zip(device.forward_s, device.backward_s))


def implausible_steps(device: DeviceProfile) -> list[str]:
    """What is implausible in `device`'s times, one phrase each (empty: nothing)."""
    return [phrase for _, phrase in _findings(device)]


def implausible_batch_sizes(device: DeviceProfile) -> list[int]:
    """The batch sizes the phrases of `implausible_steps` involve, in order."""
    return sorted({b for sizes, _ in _findings(device) for b in sizes})


def _findings(device: DeviceProfile) -> list[tuple[tuple[int, ...], str]]:
    """(batch sizes, phrase) of every implausible thing: between adjacent batch sizes, then against
    the whole steps the probe timed."""
    found = [f for i in range(len(device.batch_sizes) - 1) for f in _between(device, i)]
    return found + _against_whole_steps(device)


def _between(device: DeviceProfile, i: int) -> list[tuple[tuple[int, ...], str]]:
    """What is implausible between batch sizes i and i + 1."""
    small, large = device.batch_sizes[i], device.batch_sizes[i + 1]
    before, after = step_seconds(device, i), step_seconds(device, i + 1)
    if before <= 0 or after <= 0:
        return []
    found = []
    rise = (after / large) / (before / small)
    if rise > RISE_FACTOR:
        found.append(((small, large), f"time per sample rises {rise:.0f}x from batch {small} to {large}"))
    if after < FALL_FACTOR * before:
        found.append(((small, large), f"a step at batch {large} takes {after / before:.2f} of one at {small}"))
    return found


def _against_whole_steps(device: DeviceProfile) -> list[tuple[tuple[int, ...], str]]:
    """Measured devices: the layer sum against the whole training steps timed in the same rounds
    (`train_step_s`; within 15% on a quiet machine, docs/profiling.md)."""
    if not device.train_step_s:
        return []
    found = []
    for i, (b, whole) in enumerate(zip(device.batch_sizes, device.train_step_s)):
        layers = step_seconds(device, i)
        if whole > 0 and layers > 0 and not 1 / STEP_MISMATCH <= layers / whole <= STEP_MISMATCH:
            found.append(((b,), f"the layers sum to {layers / whole:.3g}x a whole step at batch {b}"))
    return found


def timing_warning(device: DeviceProfile) -> str | None:
    """One line naming the device, the batch sizes and their times per sample; None when plausible."""
    problems = implausible_steps(device)
    if not problems:
        return None
    sizes = implausible_batch_sizes(device)
    times = ", ".join(f"{step_seconds(device, device.batch_sizes.index(b)) / b * 1e3:.3g} @{b}" for b in sizes)
    shown = "; ".join(problems[:SHOWN_PROBLEMS]) + (f"; {len(problems) - SHOWN_PROBLEMS} more"
                                                     if len(problems) > SHOWN_PROBLEMS else "")
    return (f"device {device.name}: implausible training times at batch sizes {', '.join(map(str, sizes))} "
            f"(ms/sample {times}: {shown}); measure it again (hppctl profile --force) before "
            f"trusting plans at these batch sizes")


def timing_warnings(profile: Profile) -> list[str]:
    return [line for d in profile.devices if (line := timing_warning(d)) is not None]


def share_machine_memory(devices: Sequence[DeviceProfile],
                         machine_of: Mapping[str, str]) -> tuple[list[DeviceProfile], list[str]]:
    """`devices` with each machine's measured memory split among its devices, and one note per
    machine shared.

    `machine_of` maps a device name to a key naming its machine (devices absent from it are left
    alone). Only budgets the probe measured are shared: a device with `memory:` in the cluster file
    keeps it. Each of n devices gets the machine's memory / n minus its worker's runtime, so the
    budgets sum to at most the machine's memory. Devices computing on the machine's GPU share the
    GPU's memory among themselves (apart from its CPU devices); on a discrete GPU the worker's
    runtime (host memory) is not taken off their share."""
    groups: dict[tuple[str, str], list[DeviceProfile]] = defaultdict(list)
    for d in devices:
        if d.name in machine_of and _measured_budget(d):
            groups[(machine_of[d.name], d.accelerator.type if d.accelerator else "cpu")].append(d)
    replaced: dict[str, DeviceProfile] = {}
    notes = []
    for (machine, _), members in groups.items():
        if len(members) < 2:
            continue
        total = min(d.measurement.memory_measured_bytes for d in members)
        share = total // len(members)
        for d in members:
            replaced[d.name] = _with_budget(d, max(1, share - _runtime_in_budget(d)), len(members))
        notes.append(f"{', '.join(d.name for d in members)} share {machine}'s {format_bytes(total)} "
                     f"({members[0].measurement.memory_budget_source.split(' minus ')[0]}): {format_bytes(share)} each "
                     f"less the worker's runtime; give a device `memory:` in the cluster file to set its budget")
    return [replaced.get(d.name, d) for d in devices], notes


def _runtime_in_budget(device: DeviceProfile) -> int:
    """The worker's runtime counted against the device's budget: host memory, so not on a discrete GPU."""
    gpu = device.accelerator
    if gpu is not None and gpu.type != "cpu" and not gpu.integrated:
        return 0
    return device.runtime_bytes or 0


def _measured_budget(device: DeviceProfile) -> bool:
    info = device.measurement
    return info is not None and info.memory_budget_source != "inventory" and bool(info.memory_measured_bytes)


def _with_budget(device: DeviceProfile, budget: int, sharing: int) -> DeviceProfile:
    info = device.measurement
    source = info.memory_budget_source.replace(" minus ", f" shared by {sharing} devices, minus ", 1)
    if source == info.memory_budget_source:
        source += f" (shared by {sharing} devices)"
    return device.model_copy(update={"memory_bytes": budget,
                                     "measurement": info.model_copy(update={"memory_budget_source": source})})
