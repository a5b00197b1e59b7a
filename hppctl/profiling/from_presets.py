"""Profiles from device presets: a cluster inventory + a model's layer sequence -> `Profile`.

Pure (no torch, no I/O): `hppctl profile` calls it once the zoo has turned the model into
layers, and tests call it with hand-made layers. Clusters with `host:` / `local:` devices are
profiled by `hppctl.profiling.cluster.profile_cluster`, which measures those devices and uses
`layer_times` here for the preset ones.
"""

from __future__ import annotations

from collections.abc import Sequence

from hppctl.errors import BadInput
from hppctl.models.cluster import ClusterSpec
from hppctl.models.profile import DeviceProfile, LayerCost, LinkProfile, Profile
from hppctl.profiling.presets import DevicePreset, get_preset

DEFAULT_BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
"""Powers of two 1..256: the range the Asteroid paper profiled for EfficientNet-B1, MobileNetV2 and
Bert-small (its §5.7). ResNet50 at 224x224 was profiled to 32 only, for lack of device memory; a
preset has no such limit, and the planner never asks for more samples than fit the budget."""

OPTIMIZER_STATE_FACTORS = {"sgd": 0.0, "momentum": 1.0, "adam": 2.0}
"""Optimizer state in units of the parameter bytes (`Profile.optimizer_state_factor`)."""


def preset_devices(cluster: ClusterSpec, source: str | None = None) -> dict[str, DevicePreset]:
    """The preset of every `preset:` device, by name (`UnknownPreset` naming the device and field for a
    bad name). `host:` and `local:` devices are measured instead (`hppctl.profiling.cluster`)."""
    where = f"{source}: " if source else ""
    return {spec.name: get_preset(spec.preset, device=spec.name, source=f"{where}devices.{i}.preset")
            for i, spec in enumerate(cluster.devices) if spec.preset is not None}


def resolve_presets(cluster: ClusterSpec, source: str | None = None) -> list[DevicePreset]:
    """Each device's preset, in order, for a cluster of presets only (what `build_preset_profile` models).

    `BadInput` for a `host:`/`local:` device: those are measured, by `profile_cluster` (which models
    the preset devices of a mixed cluster itself); `UnknownPreset` for a bad name.
    """
    where = f"{source}: " if source else ""
    for i, device in enumerate(cluster.devices):
        if device.preset is None:
            how = f"host {device.host!r}" if device.host is not None else "local: true"
            raise BadInput(f"{where}devices.{i}: device {device.name!r} ({how}) is not a preset: it is measured "
                           f"(hppctl.profiling.cluster.profile_cluster), not modelled")
    presets = preset_devices(cluster, source)
    return [presets[spec.name] for spec in cluster.devices]


def validate_batch_sizes(batch_sizes: Sequence[int]) -> list[int]:
    """Sorted, de-duplicated, all positive; `BadInput` naming the bad value otherwise."""
    if not batch_sizes:
        raise BadInput("batch sizes: need at least one")
    for b in batch_sizes:
        if isinstance(b, bool) or not isinstance(b, int) or b <= 0:
            raise BadInput(f"batch sizes: {b!r} is not a positive whole number of samples")
    return sorted(set(batch_sizes))


def group_layers(coarse: Sequence[LayerCost], fine: Sequence[LayerCost]) -> list[list[LayerCost]] | None:
    """Split `fine` into consecutive runs, one per `coarse` layer, or None if it does not nest.

    The zoo's fine layers nest inside its block layers (every block cut is a fine cut), so each
    block is a run of fine layers with the same FLOPs, parameter and activation bytes in total,
    ending at a cut that carries the same boundary bytes. Used to time a block as the sum of
    its kernels, which keeps `fine` and `block` profiles of one model consistent.
    """
    groups: list[list[LayerCost]] = []
    j = 0
    for layer in coarse:
        run: list[LayerCost] = []
        flops = params = act = 0
        while j < len(fine):
            f = fine[j]
            run.append(f)
            j += 1
            flops += f.forward_flops_per_sample
            params += f.param_bytes
            act += f.activation_bytes_per_sample
            if (flops, params, act, f.boundary_bytes_per_sample) == (
                    layer.forward_flops_per_sample, layer.param_bytes, layer.activation_bytes_per_sample,
                    layer.boundary_bytes_per_sample):
                break
        else:
            return None
        groups.append(run)
    if j != len(fine):
        return None
    return groups


def layer_times(preset: DevicePreset, layers: Sequence[LayerCost], batch_sizes: Sequence[int], *,
                parts: Sequence[Sequence[LayerCost]] | None = None,
                dtype_bytes: int = 4) -> tuple[list[list[float]], list[list[float]]]:
    """Forward and backward seconds of every layer at every batch size on one preset.

    A layer reads what crosses the cut before it (the previous layer's boundary bytes). With
    `parts`, layer i is timed as the sum of its constituent (finer) layers `parts[i]`.
    """
    return (_summed_per_group(preset.forward_seconds, layers, batch_sizes, parts, dtype_bytes),
            _summed_per_group(preset.backward_seconds, layers, batch_sizes, parts, dtype_bytes))


def _summed_per_group(seconds, layers: Sequence[LayerCost], batch_sizes: Sequence[int],
                      parts: Sequence[Sequence[LayerCost]] | None, dtype_bytes: int) -> list[list[float]]:
    """`seconds(layer, batch, dtype_bytes, bytes read per sample)` of every layer at every batch size,
    each (with `parts`) the sum over its finer layers, each reading the previous layer's boundary."""
    groups = [[layer] for layer in layers] if parts is None else parts
    rows = []
    previous: LayerCost | None = None
    for group in groups:
        row = [0.0] * len(batch_sizes)
        for layer in group:
            read = previous.boundary_bytes_per_sample if previous is not None else None
            for k, b in enumerate(batch_sizes):
                row[k] += seconds(layer, b, dtype_bytes, read)
            previous = layer
        rows.append(row)
    return rows


def weight_grad_times(preset: DevicePreset, layers: Sequence[LayerCost], batch_sizes: Sequence[int], *,
                      parts: Sequence[Sequence[LayerCost]] | None = None, dtype_bytes: int = 4) -> list[list[float]]:
    """The weight-gradient part of every layer's backward (`layer_times`) at every batch size: each
    (finer) layer's backward times its class's weight-gradient share (presets.weight_grad_share), so
    never more than the backward `layer_times` predicts."""
    return _summed_per_group(preset.weight_grad_seconds, layers, batch_sizes, parts, dtype_bytes)


def preset_device_profile(name: str, preset: DevicePreset, layers: Sequence[LayerCost], batch_sizes: list[int],
                          *, memory_bytes: int | None = None, parts: Sequence[Sequence[LayerCost]] | None = None,
                          dtype_bytes: int = 4) -> DeviceProfile:
    """One device's timings on the batch grid from its preset."""
    forward, backward = layer_times(preset, layers, batch_sizes, parts=parts, dtype_bytes=dtype_bytes)
    weight_grad = weight_grad_times(preset, layers, batch_sizes, parts=parts, dtype_bytes=dtype_bytes)
    return DeviceProfile(
        name=name, kind=preset.name, memory_bytes=memory_bytes or preset.memory_budget_bytes,
        batch_sizes=list(batch_sizes), forward_s=forward, backward_s=backward,
        weight_grad_s=[[min(w, b) for w, b in zip(w_row, b_row)] for w_row, b_row in zip(weight_grad, backward)],
        peak_flops=preset.peak_flops,
    )


def build_preset_profile(
    cluster: ClusterSpec,
    layers: list[LayerCost],
    *,
    model: str,
    granularity: str,
    batch_sizes: list[int] | None = None,
    optimizer_state_factor: float = 1.0,
    parts: list[list[LayerCost]] | None = None,
    source: str | None = None,
) -> Profile:
    """A `source: "preset"` profile of `layers` on every device of `cluster`.

    Memory budget: the device's `memory:` if given, else the preset's budget (total minus the
    OS/runtime reserve). Links: the cluster's default bandwidth, plus one entry per device pair
    whose bandwidth differs from it (`ClusterSpec.bandwidth_between`, last override wins).
    `parts[i]`, if given, lists the finer layers layer i is made of (`group_layers`); its time is
    then their sum. `source` (the cluster file name) only decorates error messages.
    """
    if not layers:
        raise BadInput(f"model {model!r}: no layers")
    if parts is not None and len(parts) != len(layers):
        raise ValueError(f"parts has {len(parts)} groups for {len(layers)} layers")
    if optimizer_state_factor < 0:
        raise BadInput(f"optimizer_state_factor: must not be negative (got {optimizer_state_factor})")
    grid = validate_batch_sizes(DEFAULT_BATCH_SIZES if batch_sizes is None else batch_sizes)
    presets = resolve_presets(cluster, source)
    devices = [preset_device_profile(spec.name, preset, layers, grid, memory_bytes=spec.memory, parts=parts)
               for spec, preset in zip(cluster.devices, presets)]
    return Profile(
        source="preset", cluster=cluster.name, model=model, granularity=granularity,
        optimizer_state_factor=float(optimizer_state_factor), layers=list(layers), devices=devices,
        default_bytes_per_s=cluster.bandwidth, links=pair_links(cluster),
    )


def pair_links(cluster: ClusterSpec) -> list[LinkProfile]:
    """One `LinkProfile` per unordered device pair whose bandwidth differs from the default."""
    names = [d.name for d in cluster.devices]
    links = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            rate = cluster.bandwidth_between(a, b)
            if rate != cluster.bandwidth:
                links.append(LinkProfile(between=[a, b], bytes_per_s=rate))
    return links
