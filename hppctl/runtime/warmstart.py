"""`hppctl run --init-from PATH`: a new run that starts from trained weights instead of the seed's.

PATH is either a `--save-model` file (one state dict under the model's own names, runtime/results.py)
or a checkpoint directory (its newest complete round, the stages' tensors joined by name; a psl run's
round, every device's parts joined: after FedAvg they hold one model). Only the
weights carry over — parameters and persistent buffers (BatchNorm statistics); the optimizer state,
the round counter and the learning-rate schedule start afresh, and the dataset and seed may differ.
The weights are checked here, before the lock is taken and any worker starts: everything a strict
`load_state_dict` would refuse, or load and then train on garbage, is exit 2 with one line naming the
file and the first offending tensor. The launcher loads them into the whole model before cutting it
into the plan's stages (runtime/stage.py: `initial_stage_tensors`), so any plan of the model can start
from them: other cut points, replicated stages, asynchronous schedules.
"""

from __future__ import annotations

import io
from pathlib import Path

from hppctl.errors import BadInput
from hppctl.runtime.checkpoint import COMPLETE, CheckpointDir, read_regular_file, short_repr
from hppctl.runtime.results import WRAPPER_PREFIX, state_names

FLAG = "--init-from"


def load_initial_state(path: Path, model: str) -> dict:
    """The trained state at `path` for `model`, under the wrapper's names (`model.…`), restricted to
    the model's parameters and persistent buffers; `BadInput` naming the file and tensor otherwise."""
    if not path.exists():
        raise BadInput(f"{FLAG}: {path}: no such file or directory (a --save-model file or a --checkpoint-dir)")
    if path.is_dir():
        source, tensors = _checkpoint_tensors(path, model)
    else:
        source, tensors = path, _model_file_tensors(path)
    return _checked_state(source, tensors, model)


def _reflagged(error: BadInput) -> BadInput:
    """The checkpoint readers name `--resume` in their messages; here the directory came from --init-from."""
    return BadInput(f"{FLAG}: {str(error).removeprefix('--resume: ')}")


def _checkpoint_tensors(path: Path, model: str) -> tuple[Path, dict]:
    """The newest complete round's stage tensors joined, as the file names them (`model.…`), after
    the checks `--resume` makes (record, digests, stage files loadable, shapes, finite values)."""
    from hppctl.runtime.preflight import check_stage_files

    try:
        meta = CheckpointDir(path).newest_meta()
        if meta is not None and meta.get("kind") == "psl":  # (newest_meta checked `kind`)
            return _psl_checkpoint_tensors(path, model)
        found = CheckpointDir(path).newest_round({})
        if found is None:
            raise BadInput(f"{FLAG}: {path}: a directory without a complete round (no round-*/{COMPLETE}); "
                           f"give a --checkpoint-dir a run has written, or a --save-model file")
        where, meta, blobs = found
        plan_model = (meta.get("plan") or {}).get("model")
        if plan_model is not None and plan_model != model:
            raise BadInput(f"{FLAG}: {where / COMPLETE}: plan.model: {plan_model!r}, this run trains {model!r}")
        check_stage_files(where, meta, blobs)
    except BadInput as e:
        raise _reflagged(e) from None
    import torch

    joined: dict = {}
    for p in sorted(blobs):
        joined.update(torch.load(io.BytesIO(blobs[p]), weights_only=True, map_location="cpu")["model"])
    return where, joined


def _psl_checkpoint_tensors(path: Path, model: str) -> tuple[Path, dict]:
    """A psl run's newest round (record, digests) as one model: the union of every device's parts. Its
    files are taken after FedAvg, when every copy of a tensor holds the same average, and every tensor
    of the model is in a part of each client (runtime/psl/fedavg.py): any holder's copy is the model's.
    Raises `BadInput` with `--resume:` messages (the caller re-flags them)."""
    from hppctl.runtime.checkpoint import stage_file_name
    from hppctl.runtime.preflight import load_stage_file

    where, meta, blobs = CheckpointDir(path).newest_round({"kind": "psl"})
    layout = meta.get("psl_layout")
    trained = layout.split(" ", 1)[0] if isinstance(layout, str) else None  # `psl.checkpoint.layout_line`
    if trained != model:
        raise BadInput(f"--resume: {where / COMPLETE}: psl_layout: {short_repr(layout)} trained "
                       f"{short_repr(trained)}, this run trains {model!r}")
    joined: dict = {}
    for p in sorted(blobs):
        state = load_stage_file(where / stage_file_name(p), blobs[p])
        parts = state.get("parts") if isinstance(state, dict) else None
        if not isinstance(parts, dict) or not all(isinstance(part, dict) for part in parts.values()):
            raise BadInput(f"--resume: {where / stage_file_name(p)}: parts: expected state dicts by part, got "
                           f"{short_repr(parts)}")
        for part in parts.values():
            for name, tensor in part.items():
                joined.setdefault(name, tensor)
    return where, joined


def _model_file_tensors(path: Path) -> dict:
    """A `--save-model` file's tensors under the wrapper's names (the file holds the model's own)."""
    import torch

    from hppctl.runtime.preflight import load_failure

    try:
        blob = read_regular_file(path)
    except BadInput as e:
        raise _reflagged(e) from None
    try:
        state = torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - torch.load raises a dozen types on a damaged or hostile file
        raise BadInput(f"{FLAG}: {path}: not a model file torch loads with weights_only ({load_failure(e)})") from None
    if isinstance(state, dict) and {"round", "stage", "model"} <= set(state):
        raise BadInput(f"{FLAG}: {path}: one stage of a checkpoint round; give its checkpoint directory "
                       f"({path.parent.parent})")
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise BadInput(f"{FLAG}: {path}: expected a state dict (tensors by name) as --save-model writes, got "
                       f"{short_repr(state)}")
    return {WRAPPER_PREFIX + k: v for k, v in state.items()}


def _checked_state(source: Path, tensors: dict, model: str) -> dict:
    """`tensors` checked against `model`'s tensors (built on the meta device: nothing allocated) and
    restricted to its state names. Names are reported as `source` spells them."""
    import torch

    from hppctl.zoo import get_model

    whole = get_model(model).build(device="meta")
    wanted = dict(whole.state_dict(keep_vars=True))
    known = {**dict(whole.named_parameters()), **dict(whole.named_buffers())}  # non-persistent buffers too
    from_checkpoint = source.name == COMPLETE or source.is_dir()

    def shown(name: str) -> str:
        return name if from_checkpoint else name.removeprefix(WRAPPER_PREFIX)

    missing = [k for k in state_names(whole) if k not in tensors]
    if missing:
        raise BadInput(f"{FLAG}: {source}: {shown(missing[0])}: missing ({len(missing)} of {model}'s "
                       f"{len(wanted)} tensors are); is it a {model} model?")
    extra = [k for k in tensors if k not in known]
    if extra:
        raise BadInput(f"{FLAG}: {source}: {short_repr(shown(extra[0]))}: not a tensor of {model} "
                       f"({len(extra)} such)")
    for name, want in wanted.items():
        got = tensors[name]
        if got.layout != torch.strided or got.device.type != "cpu":
            raise BadInput(f"{FLAG}: {source}: {shown(name)}: a {got.layout} tensor on {got.device.type}, "
                           f"not a dense CPU tensor")
        if tuple(got.shape) != tuple(want.shape):
            raise BadInput(f"{FLAG}: {source}: {shown(name)}: shape {list(got.shape)}, {model}'s is "
                           f"{list(want.shape)}")
        if got.dtype != want.dtype:
            raise BadInput(f"{FLAG}: {source}: {shown(name)}: dtype {got.dtype}, {model}'s is {want.dtype}")
        if got.is_floating_point():
            bad = int((~torch.isfinite(got)).sum())
            if bad:
                raise BadInput(f"{FLAG}: {source}: {shown(name)}: {bad} NaN or infinite value"
                               f"{'s' if bad > 1 else ''} of {got.numel()}; the run that wrote it diverged")
    return {name: tensors[name] for name in wanted}
