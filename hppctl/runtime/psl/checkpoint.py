"""Checkpoints of a PSL run: every device's parts and optimizers, one file per device.

A round directory of `--checkpoint-dir` (runtime/checkpoint.py's `CheckpointDir`: the same lock,
`COMPLETE.json` record, digests and pruning as a layer-wise run's) holds `stage-<rank>.pt` for every
device of the plan, in `PslTopology.devices` order (the clients, then the helpers): a client's parts
1 and 3 and its optimizer, a helper's part-2 copy and optimizer for each client it serves
(`PslWorker.state_blob`). Written after FedAvg, so every client's model is the same average; the
optimizer states differ per copy, which is why every device's file is kept, not one model.

A run resumes from the newest round written by a run of the same layout (model, granularity, batch,
clients, helpers, cuts, assignment: `layout_line`) and the same numbers (dataset, seed, optimizer,
local batches, shares); `--order` is left out (the order changes no number, docs/psl.md). Another
layout is refused: each device's state is cut by its plan, and no re-cut between PSL plans exists.
"""

from __future__ import annotations

import math
from pathlib import Path

from hppctl.errors import BadInput
from hppctl.models.psl import PslPlan
from hppctl.runtime.checkpoint import COMPLETE, CheckpointDir, short_repr, stage_file_name
from hppctl.runtime.psl.config import PslOptions
from hppctl.runtime.psl.topology import PslTopology

KIND = "psl"
"""`kind` of a PSL round's COMPLETE.json (a layer-wise run's records none): neither resumes the other's."""


def layout_line(plan: PslPlan) -> str:
    """What fixes the shapes of every device's state, in one line a refusal can print."""
    clients = ", ".join(f"{c} {list(cut)} on {h}" for c, cut, h in zip(plan.clients, plan.cuts, plan.assignment))
    return f"{plan.model} {plan.granularity} batch {plan.batch}: {clients}"


def psl_fingerprint(plan: PslPlan, options: PslOptions) -> dict:
    """What a PSL checkpoint records and a resuming run must share with it."""
    train = options.train
    return {"kind": KIND, "psl_layout": layout_line(plan),
            **{k: getattr(train, k) for k in ("dataset", "seed", "optimizer", "lr", "momentum", "weight_decay")},
            "local_batches": options.local_batches, "shares": options.shares}


def resume_point(ckpt: CheckpointDir, plan: PslPlan, options: PslOptions) -> tuple[int, dict[int, bytes]]:
    """(the newest round, its files by rank) of a run with these settings; (0, {}) when there is none.
    `BadInput` naming the file for a record of another kind of run, other settings, a damaged or
    altered file (`CheckpointDir.newest_round`), or a file that is not the state its device holds."""
    found = ckpt.newest_round(psl_fingerprint(plan, options))
    if found is None:
        return 0, {}
    where, meta, blobs = found
    check_device_files(where, plan, blobs)
    return meta["round"], blobs


def check_device_files(where: Path, plan: PslPlan, blobs: dict[int, bytes]) -> None:
    """Every device's file of a round: one per device, loads safely (tensors only), holds the parts its
    device holds with the plan's names and shapes, an optimizer state for each that fits its
    parameters (`preflight.check_optimizer_state`, as a layer-wise stage's), finite values."""
    from hppctl.runtime.checkpoint import StageTensors
    from hppctl.runtime.preflight import check_optimizer_state, load_stage_file
    from hppctl.runtime.psl.worker import num_layers

    topo, layers = PslTopology.of(plan), num_layers(plan.model, plan.granularity)
    if sorted(blobs) != list(range(len(topo.devices))):
        raise BadInput(f"--resume: {where / COMPLETE}: stages: {len(blobs)} files for the {len(topo.devices)} "
                       f"devices of the plan")
    cut = StageTensors({"model": plan.model, "granularity": plan.granularity})
    for rank, device in enumerate(topo.devices):
        path = where / stage_file_name(rank)
        state = load_stage_file(path, blobs[rank])
        if not isinstance(state, dict):
            raise BadInput(f"--resume: {path}: not a PSL device state (a {type(state).__name__})")
        held = {name: cut.module(*_range(topo, device, name, layers)) for name in _part_names(topo, device)}
        optimized = _optimized(topo, device, held)
        parts, optimizers = state.get("parts"), state.get("optimizers")
        if not isinstance(parts, dict) or sorted(parts) != sorted(held):
            raise BadInput(f"--resume: {path}: parts: {_names(parts)}, where {device} holds {_names(held)}")
        if not isinstance(optimizers, dict) or sorted(optimizers) != sorted(optimized):
            raise BadInput(f"--resume: {path}: optimizers: {_names(optimizers)}, where {device} has {_names(optimized)}")
        for name, module in held.items():
            _check_part(path, name, parts[name], {k: tuple(v.shape) for k, v in module.state_dict().items()})
        for name, modules in optimized.items():
            named = [(n, tuple(t.shape)) for module in modules for n, t in module.named_parameters()]
            _check_optimizer_record(path, name, optimizers[name])
            check_optimizer_state(path, optimizers[name], [n for n, _ in named], dict(named))
        _check_finite(path, state)


def _part_names(topo: PslTopology, device: str) -> list[str]:
    return ["part1", "part3"] if device in topo.clients else list(topo.clients_of(device))


def _optimized(topo: PslTopology, device: str, held: dict) -> dict[str, list]:
    """Each optimizer of `device` and the parts it steps, in its parameters' order (`PslWorker`)."""
    if device in topo.clients:
        return {"client": [held["part1"], held["part3"]]}
    return {client: [held[client]] for client in topo.clients_of(device)}


def _range(topo: PslTopology, device: str, part: str, layers: int) -> tuple[int, int]:
    """The layers of `device`'s `part` (a client's part1/part3, a helper's copy for client `part`)."""
    if device in topo.clients:
        s1, s2 = topo.cuts[device]
        return (0, s1) if part == "part1" else (s2, layers)
    return tuple(topo.cuts[part])


def _check_optimizer_record(path: Path, name: str, optimizer: object) -> None:
    """The shape of an optimizer state dict, before `check_optimizer_state` reads it."""
    if not isinstance(optimizer, dict):
        raise BadInput(f"--resume: {path}: optimizers.{name}: expected a state dict, got {short_repr(optimizer)}")
    moments = optimizer.get("state", {})
    if not isinstance(moments, dict) or not all(isinstance(v, dict) for v in moments.values()):
        raise BadInput(f"--resume: {path}: optimizers.{name}.state: expected per-parameter dicts, got "
                       f"{short_repr(moments)}")


def _check_part(path: Path, name: str, tensors: object, shapes: dict[str, tuple[int, ...]]) -> None:
    import torch

    if not isinstance(tensors, dict) or sorted(tensors) != sorted(shapes):
        raise BadInput(f"--resume: {path}: parts.{name}: tensors {_names(tensors)}, where the plan's part holds "
                       f"{_names(shapes)}")
    for key, shape in shapes.items():
        value = tensors[key]
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise BadInput(f"--resume: {path}: parts.{name}.{key}: shape {got}, the plan's part has {shape}")


def _check_finite(path: Path, state: object, where: str = "") -> None:
    import torch

    if isinstance(state, torch.Tensor):
        if state.is_floating_point() and not bool(torch.isfinite(state).all()):
            raise BadInput(f"--resume: {path}: {where.lstrip('.')} holds NaN or infinity")
    elif isinstance(state, dict):
        for key, value in state.items():
            _check_finite(path, value, f"{where}.{key}")
    elif isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            _check_finite(path, value, f"{where}.{i}")
    elif isinstance(state, float) and not math.isfinite(state):
        raise BadInput(f"--resume: {path}: {where.lstrip('.')} is {state}")


def _names(value: object) -> str:
    names = sorted(map(str, value)) if isinstance(value, (dict, list)) else [type(value).__name__]
    text = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return text or "none"
