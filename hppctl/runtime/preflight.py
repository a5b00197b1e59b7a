"""Checks made before any worker starts: plan, profile, cluster, model and dataset must agree.

Every failure is `BadInput` (exit 2) naming the file and what disagrees, so a run never gets as far
as starting processes on devices with a plan it cannot execute. `check_checkpoint` does the same for
the checkpoint directory: its lock file and, with `--resume`, the round the workers would load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hppctl.errors import BadInput, PlanMismatch, first_line
from hppctl.models.cluster import ClusterSpec
from hppctl.models.plan import HppPlan
from hppctl.models.profile import Profile
from hppctl.runtime.checkpoint import (COMPLETE, DIGESTS, CheckpointDir, check_lock_file, short_repr,
                                       stage_file_name)


def check_devices(plan: HppPlan, cluster: ClusterSpec, plan_source: str, cluster_source: str) -> None:
    placed = [(f"stages.{p}.devices", d) for p, stage in enumerate(plan.stages) for d in stage.devices]
    check_machines(placed, cluster, plan_source, cluster_source, "`hppctl run`")


def check_machines(placed, cluster: ClusterSpec, plan_source: str, cluster_source: str, runner: str) -> None:
    """Each (field, device) a plan (HPP or PSL) places is a machine of the cluster file, not a preset."""
    names = {d.name for d in cluster.devices}
    for where, d in placed:
        if d not in names:
            raise PlanMismatch(f"{plan_source}: {where}: device {d!r} is not in {cluster_source} "
                               f"(it lists {', '.join(sorted(names))})")
        spec = cluster.device(d)
        if spec.preset is not None:
            raise PlanMismatch(f"{cluster_source}: device {d!r} is a preset ({spec.preset}), a modelled device "
                               f"with no machine behind it; {runner} needs `local: true` or `host:` devices")


def check_model(plan: HppPlan, plan_source: str) -> None:
    """The model exists, trains, and has the plan's layer count; every stage cut can be executed."""
    from hppctl.zoo import get_model, layer_costs

    spec = get_model(plan.model)
    if spec.task != "train":
        raise PlanMismatch(f"{plan_source}: model {plan.model!r} is an inference model; `hppctl run` trains HPP plans")
    count = len(layer_costs(plan.model, plan.granularity))
    if count != plan.num_layers:
        raise PlanMismatch(f"{plan_source}: the plan covers {plan.num_layers} layers of {plan.model} "
                           f"({plan.granularity}), the model has {count}; re-profile and re-plan")
    _check_cuts(plan, plan_source)


def _check_cuts(plan: HppPlan, plan_source: str) -> None:
    from hppctl.zoo import trace

    traced = trace(plan.model, "train")
    for p, stage in enumerate(plan.stages):
        check_part(traced, plan.granularity, _held_layers(stage), f"{plan_source}: stages.{p}", "the cut",
                   "the runtime cannot split it by sample")
    _check_one_sample_shares(plan, plan_source, traced)


def check_part(traced, granularity: str, layers: tuple[int, int], where: str, cut: str, advice: str) -> None:
    """Layers [lo, hi) run as one part (HPP or PSL): they cut, and every float tensor crossing has a batch dimension."""
    from hppctl.zoo.stages import batch_dim, stage_signature

    try:
        inputs, outputs = stage_signature(traced, granularity, *layers)
    except BadInput as e:
        raise PlanMismatch(f"{where}: {e}") from None
    for node in (*inputs, *outputs):
        if batch_dim(traced, node) is None and traced.values1[node].dtype.is_floating_point:
            raise PlanMismatch(f"{where}: tensor {node.name} crossing {cut} has no batch dimension; {advice}")


def _held_layers(stage) -> tuple[int, int]:
    """The layers a stage's devices hold: its forward range, widened by a Bi-Partition backward range."""
    return min(stage.start, stage.backward[0]), max(stage.end, stage.backward[1])


def _check_one_sample_shares(plan: HppPlan, plan_source: str, traced) -> None:
    """A device given 1 sample of each micro-batch normalises each BatchNorm over that sample alone
    (docs/runtime.md, "BatchNorm"); where a BatchNorm sees one value per channel for a sample (a 1x1
    feature map) PyTorch refuses to train it, so the run would fail on that device after start-up."""
    singles = _one_value_batchnorms(traced, plan.granularity)
    for p, stage in enumerate(plan.stages):
        lo, hi = _held_layers(stage)
        blocked = sorted(i for i in singles if lo <= i < hi)
        for device, y in zip(stage.devices, stage.samples):
            if y == 1 and blocked:
                raise PlanMismatch(
                    f"{plan_source}: stages.{p}.samples: {device} gets 1 sample of each micro-batch, and "
                    f"BatchNorm {singles[blocked[0]]} (layer {blocked[0]}) sees one value per channel for one "
                    f"sample, which PyTorch cannot train; plan with a larger --micro-batch")


def _one_value_batchnorms(traced, granularity: str) -> dict[int, str]:
    """Layer index -> the first BatchNorm in it whose input has one value per channel at batch 1."""
    from torch.nn.modules.batchnorm import _BatchNorm

    index = traced.layer_index(granularity)
    found: dict[int, str] = {}
    for node in traced.nodes:
        if node.op != "call_module" or node not in index:
            continue
        module = traced.root.get_submodule(node.target)
        if not isinstance(module, _BatchNorm):
            continue
        value = traced.values1.get(node.args[0])
        if value is not None and value.dim() >= 2 and value.numel() == value.shape[1]:
            found.setdefault(index[node], node.target)
    return found


# --- what each kind of run can do: the one table ------------------------------------------------------
# A flag a run cannot honour is refused here, before any worker starts (exit 2, one line saying why),
# never dropped: `--schedule nf1b --profile` trained without fault tolerance, and `--resume` on a psl
# plan trained from scratch, without a word. docs/runtime.md "Features" prints this table
# (`feature_table`; tests/runtime/test_feature_matrix.py keeps the two equal).

LIMITS_DOC = 'docs/bipartition.md, "Limits"'
FEATURES_DOC = 'docs/runtime.md, "Features"'
SPLIT_DOC = 'docs/runtime.md, "Split backwards (`I`, `W`)"'

FEATURES = ("resume", "checkpoint", "asynchronous schedule", "fault tolerance", "trace", "metrics")
"""What a run can be asked for, in the order a request is checked (the first refused flag is named)."""

FEATURE_FLAGS = {"resume": "--resume", "checkpoint": "--checkpoint-dir", "asynchronous schedule": "--schedule",
                 "fault tolerance": "--profile with --replan light/heavy", "trace": "--trace", "metrics": "--metrics"}
"""How `hppctl run` asks for each feature (its docs column)."""

_NO_FT = "give --replan off, or leave out --profile"


@dataclass(frozen=True)
class RunKind:
    """A kind of run and the features it refuses, each with why (`what, why (doc)` is the error)."""
    name: str
    label: str  # its row in the docs table
    doc: str
    refused: dict[str, str] = field(default_factory=dict)


RUN_KINDS = {kind.name: kind for kind in (
    RunKind("synchronous", "training plan, synchronous rounds (default)", FEATURES_DOC),
    *(RunKind(policy, f"training plan, `--schedule {policy}`", FEATURES_DOC, {
        "fault tolerance": "which fault tolerance cannot recover yet: re-planning replays synchronous rounds, and an "
                           "asynchronous window is a whole epoch whose executor the re-planned workers do not "
                           f"rebuild; {_NO_FT}"}) for policy in ("nf1b", "pipedream")),
    RunKind("split", "training plan with split backwards (`split_backward: true`)", SPLIT_DOC, {
        "asynchronous schedule": "and asynchronous windows back-propagate whole (their versions tag `F` and `B`), "
                                 "which would drop its split"}),
    RunKind("bipartition", "Bi-Partition plan (a stage backwards other layers than it forwards)", LIMITS_DOC, {
        "asynchronous schedule": "and asynchronous windows run layer-wise stages, which would drop its backward "
                                 "ranges",
        "fault tolerance": "which cannot survive a lost device yet (re-planning, replay and state backups know "
                           f"layer-wise stages only); {_NO_FT}"}),
    RunKind("psl", "psl plan (`hppctl run` or `hppctl psl run`)", FEATURES_DOC, {
        "asynchronous schedule": "which follows its own order of clients and helpers (`hppctl psl run "
                                 "--order`), not an HPP schedule",
        "fault tolerance": "which cannot survive a lost device: a failed client or helper fails the run (exit 1)"}),
    RunKind("inference", "inference (galaxy) plan", FEATURES_DOC, {
        "resume": "which runs forward passes only and keeps no training state to resume",
        "checkpoint": "which runs forward passes only: there is no training state to checkpoint",
        "asynchronous schedule": "which is laid out by the plan itself (galaxy, megatron, sp, local); "
                                 "--schedule picks a training schedule",
        "fault tolerance": "which cannot survive a lost device: a failed worker fails the request (exit 1)",
        "trace": "which reports its passes' latencies in its summary (--json); the Chrome trace lays out "
                 "training rounds",
        "metrics": "which reports its passes' latencies in its summary (--json); --metrics rows are training "
                   "rounds"}),
)}
"""Every kind of run `hppctl run` starts: a training plan under its synchronous rounds or an
asynchronous window (`--schedule`), a split-backward plan, a Bi-Partition plan, a psl plan, an
inference plan."""


def check_features(kind: str, what: str, requested: dict[str, str | None]) -> None:
    """Refuse the first requested feature (name -> the flag that asked, None: not asked) that a run of
    `kind` cannot honour: `FLAG: WHAT, WHY (DOC)`. `what` names the plan (and its schedule)."""
    row = RUN_KINDS[kind]
    for feature in FEATURES:
        flag = requested.get(feature)
        if flag is not None and feature in row.refused:
            raise BadInput(f"{flag}: {what}, {row.refused[feature]} ({row.doc})")


def feature_table() -> list[str]:
    """`RUN_KINDS` as the markdown table of docs/runtime.md "Features"."""
    columns = list(FEATURES)
    lines = ["| run | " + " | ".join(f"{f} ({FEATURE_FLAGS[f]})" for f in columns) + " |",
             "|---" * (len(columns) + 1) + "|"]
    for kind in RUN_KINDS.values():
        cells = ["supported" if f not in kind.refused else "refused: " + re.sub(r"^(which|and) ", "", kind.refused[f])
                 for f in columns]
        lines.append(f"| {kind.label} | " + " | ".join(cells) + " |")
    return lines


def bipartition_stage(plan: HppPlan) -> int | None:
    """The first stage whose backward range differs from its forward range (None: not Bi-Partition)."""
    return next((p for p, s in enumerate(plan.stages) if s.backward_layers is not None), None)


def plan_kind_text(plan: HppPlan, plan_source: str, schedule: str | None) -> tuple[str, str]:
    """(its `RUN_KINDS` row, what the plan is, for a refusal) of an HPP training plan under `schedule`."""
    p = bipartition_stage(plan)
    if p is not None:
        return "bipartition", _bipartition_text(plan, plan_source, p)
    if plan.split_backward:
        return "split", f"{plan_source} splits its backwards (split_backward: true)"
    return schedule or "synchronous", (f"{plan_source} trained with --schedule {schedule}" if schedule
                                       else f"{plan_source}")


def _bipartition_text(plan: HppPlan, plan_source: str, p: int) -> str:
    s = plan.stages[p]
    return (f"{plan_source} is a Bi-Partition plan (stage {p} forwards [{s.start}, {s.end}) and backwards "
            f"[{s.backward[0]}, {s.backward[1]}))")


def check_bipartition_stages(plan: HppPlan, plan_source: str) -> None:
    """A Bi-Partition stage runs on one device: its split layers' weights and inputs go to one peer."""
    p = bipartition_stage(plan)
    if p is None:
        return
    crowded = next((q for q, s in enumerate(plan.stages) if len(s.devices) != 1), None)
    if crowded is not None:
        raise PlanMismatch(f"{plan_source}: stages.{crowded}.devices: {', '.join(plan.stages[crowded].devices)} "
                           f"replicate a stage of a Bi-Partition plan (stage {p} backwards other layers than it "
                           f"forwards), and Bi-Partition runs cannot replicate stages yet ({LIMITS_DOC})")


def check_bipartition_coordinator(plan: HppPlan, plan_source: str) -> None:
    """The coordinator exists to re-plan on a lost device, which a Bi-Partition plan cannot do yet."""
    p = bipartition_stage(plan)
    if p is not None:
        raise BadInput(f"--replan: {_bipartition_text(plan, plan_source, p)}, which cannot survive a lost device "
                       f"yet, and the coordinator exists to re-plan; train it with `hppctl run` without --profile "
                       f"({LIMITS_DOC})")


def check_schedule(plan: HppPlan, plan_source: str) -> None:
    from hppctl.schedule import ScheduleError, check_schedule, schedule_for_plan

    try:
        check_schedule(schedule_for_plan(plan))
    except (ScheduleError, ValueError) as e:
        raise PlanMismatch(f"{plan_source}: its schedule is invalid: {e}") from None


def check_data(plan: HppPlan, dataset: str):
    """Load the dataset as the workers will; it must hold at least one global batch."""
    from hppctl.runtime.data import load_data

    data = load_data(dataset, plan.model)
    if len(data.train) < plan.global_batch:
        raise BadInput(f"--dataset {dataset}: {len(data.train)} training samples, fewer than the plan's global "
                       f"batch {plan.global_batch}")
    return data


def preflight(plan: HppPlan, cluster: ClusterSpec, dataset: str, *, profile: Profile | None = None,
              plan_source: str = "plan", cluster_source: str = "cluster", profile_source: str = "profile"):
    """All checks, cheapest first; returns the loaded dataset."""
    check_bipartition_stages(plan, plan_source)
    check_devices(plan, cluster, plan_source, cluster_source)
    if profile is not None:
        from hppctl.planner.explain import check_plan_matches
        check_plan_matches(plan, profile, plan_source, f"the profile {profile_source}")
    check_schedule(plan, plan_source)
    check_model(plan, plan_source)
    return check_data(plan, dataset)


# --- checkpoints ----------------------------------------------------------------------------------
# `--resume` used to find a damaged round only in the workers (exit 1, a traceback per device) or
# not at all (NaN weights trained on silently). Everything a worker would trip on is checked here,
# on the files the launcher will send, before the lock is taken and any process starts.

def check_checkpoint(checkpoint_dir, plan: HppPlan, options, *, resume: bool) -> list[str]:
    """The checkpoint directory's `LOCK` can be taken safely; with `resume`, the newest complete
    round matches this run's settings (`CheckpointDir.newest_round`: record, digests) and every stage
    file loads safely (`weights_only`), is the stage the record says, has the tensor names and
    shapes the round's plan gives that stage, and holds finite values. `BadInput` (exit 2) naming the
    file and what is wrong; returns notes for the user (a round written before digests existed)."""
    from hppctl.runtime.session import resume_fingerprint

    ck = CheckpointDir(checkpoint_dir)
    check_lock_file(ck.path / "LOCK")
    if not resume:
        return []
    found = ck.newest_round(resume_fingerprint(plan, options))
    if found is None:
        return []
    where, meta, blobs = found
    check_stage_files(where, meta, blobs)
    if DIGESTS in meta:
        return []
    return [f"--resume: {where / COMPLETE} records no stage file digests (written before they existed); its "
            f"stage files were checked for shapes and finite values only"]


def check_stage_files(where, meta: dict, blobs: dict[int, bytes]) -> None:
    """Each stage file of a round (`blobs`, by stage) against its record `meta` (see `check_checkpoint`)."""
    layout = _stage_layout(meta.get("plan"), where / COMPLETE)
    for p, blob in sorted(blobs.items()):
        path = where / stage_file_name(p)
        state = load_stage_file(path, blob)
        _check_stage_record(path, state, meta["round"], p)
        if layout is not None:
            shapes, params = layout[p]
            _check_tensor_shapes(path, state["model"], shapes)
            check_optimizer_state(path, state["optimizer"], params, shapes)
        _check_finite(path, state)


def _stage_layout(plan_document, source) -> list[tuple[dict, list[str]]] | None:
    """Per stage of a plan document: (tensor name -> shape of what its file holds, parameter names in
    the optimizer's order: `checkpoint.StageTensors`), from stages built on the meta device (nothing
    is allocated). None: no plan recorded (the resume is refused by the plan check)."""
    from hppctl.runtime.checkpoint import StageTensors

    if plan_document is None:
        return None
    layout, stages = StageTensors(plan_document), plan_document["stages"]  # read_meta validated it
    out = []
    for p, stage in enumerate(stages):
        try:
            out.append((layout.written(stage), layout.stepped(stage)))
        except BadInput as e:  # a recorded plan cut past the model's layers
            raise BadInput(f"--resume: {source}: plan.stages.{p}.layers: {e}") from None
    return out


def load_stage_file(path, blob: bytes) -> object:
    import io

    import torch

    try:
        return torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - torch.load raises a dozen types on a damaged or hostile file
        raise BadInput(f"--resume: {path}: not a stage file torch loads with weights_only "
                       f"({load_failure(e)})") from None


def load_failure(error: Exception) -> str:
    """What torch.load said, in a few words: its UnpicklingError is a page with terminal escapes
    whose useful part is the global it refused (`builtins.print` in a planted payload)."""
    refused = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(error))
    if refused:
        return f"{error.__class__.__name__}: it names {refused.group(1)}, a pickled object, not tensors"
    return f"{error.__class__.__name__}: {first_line(error)}"


def _check_stage_record(path, state: object, round_index: int, stage: int) -> None:
    import torch

    if not isinstance(state, dict):
        raise BadInput(f"--resume: {path}: expected a stage record (a dict), got {type(state).__name__}")
    for key, want in (("round", round_index), ("stage", stage)):
        if type(state.get(key)) is not int or state.get(key) != want:  # (a tensor would compare elementwise)
            raise BadInput(f"--resume: {path}: {key} is {short_repr(state.get(key))}, its round's record says {want}")
    model = state.get("model")
    if not isinstance(model, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in model.items()):
        raise BadInput(f"--resume: {path}: model: expected tensors by name, got {short_repr(model)}")
    optimizer = state.get("optimizer")
    if not isinstance(optimizer, dict):
        raise BadInput(f"--resume: {path}: optimizer: expected a state dict, got {short_repr(optimizer)}")
    moments = optimizer.get("state", {})
    if not isinstance(moments, dict) or not all(isinstance(v, dict) for v in moments.values()):
        raise BadInput(f"--resume: {path}: optimizer.state: expected per-parameter dicts, got {short_repr(moments)}")
    moment_tensors = [v for values in moments.values() for v in values.values() if isinstance(v, torch.Tensor)]
    for tensor in (*model.values(), *moment_tensors):
        if tensor.layout != torch.strided or tensor.device.type != "cpu":  # meta or sparse: no values to load
            raise BadInput(f"--resume: {path}: holds a {tensor.layout} tensor on {tensor.device.type}, not a dense "
                           f"CPU tensor as the workers write")


def _check_tensor_shapes(path, tensors: dict, shapes: dict) -> None:
    missing = [name for name in shapes if name not in tensors]
    if missing:
        raise BadInput(f"--resume: {path}: tensor {missing[0]} is missing ({len(missing)} of the stage's "
                       f"{len(shapes)} are)")
    extra = [name for name in tensors if name not in shapes]
    if extra:
        raise BadInput(f"--resume: {path}: tensor {short_repr(extra[0])} is not one of this stage's")
    for name, want in shapes.items():
        got = tuple(tensors[name].shape)
        if got != want:
            raise BadInput(f"--resume: {path}: tensor {name} has shape {list(got)}, the stage's is {list(want)}")


def check_optimizer_state(path, optimizer: dict, params: list[str], shapes: dict) -> None:
    """What `Optimizer.load_state_dict` in the worker would refuse, or load and then fail on: a
    group of another size, state for a parameter index the stage lacks, a moment of another shape."""
    import torch

    if not optimizer:
        return  # a stage without parameters saves none
    groups = optimizer.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) and isinstance(g.get("params"), list)
                                               for g in groups):
        raise BadInput(f"--resume: {path}: optimizer.param_groups: expected groups of parameter indices")
    indexed = sum(len(g["params"]) for g in groups)
    if indexed != len(params):
        raise BadInput(f"--resume: {path}: optimizer.param_groups: {indexed} parameters, the stage has {len(params)}")
    for index, values in optimizer.get("state", {}).items():  # dicts: _check_stage_record
        if type(index) is not int or not 0 <= index < len(params):
            raise BadInput(f"--resume: {path}: optimizer.state: entry {short_repr(index)} is not one of the stage's "
                           f"{len(params)} parameters")
        want = shapes[params[index]]
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and value.numel() != 1 and tuple(value.shape) != want:
                raise BadInput(f"--resume: {path}: optimizer.state.{index}.{key} (for {params[index]}) has shape "
                               f"{list(value.shape)}, the parameter's is {list(want)}")


def _check_finite(path, state: dict) -> None:
    """NaN or infinity in a weight or an optimizer moment: the run diverged before this round, and
    resuming would only train on garbage (it used to, silently)."""
    import torch

    named = list(state["model"].items())
    for index, values in state["optimizer"].get("state", {}).items():
        named += [(f"optimizer.state.{index}.{key}", v) for key, v in values.items()]
    for name, tensor in named:
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                raise BadInput(f"--resume: {path}: tensor {name} holds {bad} NaN or infinite value"
                               f"{'s' if bad > 1 else ''} of {tensor.numel()}; the run diverged before this round "
                               f"(remove {path.parent} to resume from the round before, if one is kept)")
