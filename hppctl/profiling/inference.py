"""Galaxy's profiler: a cluster + a transformer + sequence lengths -> `InferenceProfile`.

Measured devices (`host:`/`local:`) run the `inference-blocks` probe kind (inference_probe.py)
through `fleet.probe_devices`, in parallel; preset devices are modelled from their published
specifications with the same roofline the training profiler uses (presets.py), one block at a time.
M_att and M_mlp come from the model's shapes (weights and biases, `dtype_bytes` each).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hppctl.errors import BadInput, RuntimeFailure
from hppctl.models.cluster import ClusterSpec
from hppctl.models.inference import BlockGrid, InferenceDevice, InferenceLink, InferenceProfile, SeqLenTimings
from hppctl.models.profile import LayerCost
from hppctl.profiling.inference_probe import fraction_grid, head_grid

PROBE_MODULE = "hppctl.profiling.inference_probe"


@dataclass(frozen=True)
class Shapes:
    """What the profile needs of a model: its family and layer dimensions."""

    family: str
    layers: int
    hidden: int
    heads: int
    intermediate: int
    embedding_params: int = 0
    """Token, position (and BERT token-type) embeddings."""


def model_shapes(model: str) -> Shapes:
    """The transformer's dimensions from its config (no weights are built)."""
    from hppctl.zoo.build import build_module  # noqa: F401, I001  (sets HF_HUB_OFFLINE before transformers reads it)

    import transformers

    from hppctl.zoo import get_model

    spec = get_model(model)
    if spec.family not in ("bert", "distilbert", "gpt2", "opt"):
        raise BadInput(f"--model: {model} is a {spec.family} model; collaborative inference needs a transformer "
                       f"(bert, distilbert, gpt2, opt)")
    config_cls = getattr(transformers, spec.family_info.config_class)
    config = config_cls.from_pretrained(spec.hf_path, local_files_only=True) if spec.hf_path else config_cls(**spec.config)
    inner = getattr(config, "intermediate_size", None) or getattr(config, "ffn_dim", None) \
        or getattr(config, "hidden_dim", None) or getattr(config, "n_inner", None) or 4 * config.hidden_size
    if spec.family == "distilbert":
        inner = config.hidden_dim
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 0)
    positions += 2 if spec.family == "opt" else 0  # OPT's learned positions are offset by 2
    rows = config.vocab_size + positions + (getattr(config, "type_vocab_size", 0) if spec.family == "bert" else 0)
    return Shapes(spec.family, config.num_hidden_layers, config.hidden_size, config.num_attention_heads, int(inner),
                  rows * config.hidden_size)


def block_bytes(shapes: Shapes, dtype_bytes: int) -> tuple[int, int]:
    """(M_att, M_mlp): one layer's attention weights + biases (4h² + 4h) and MLP's (2·h·I + I + h)."""
    h, i = shapes.hidden, shapes.intermediate
    return (4 * h * h + 4 * h) * dtype_bytes, (2 * h * i + i + h) * dtype_bytes


# --- preset devices ----------------------------------------------------------------------------------

def _cost(name: str, kind: str, flops: float, activation: int, params: int) -> LayerCost:
    return LayerCost(name=name, kind=kind, boundary_bytes_per_sample=activation, activation_bytes_per_sample=activation,
                     param_bytes=params, forward_flops_per_sample=int(flops))


def preset_timings(preset, shapes: Shapes, seq_len: int, dtype_bytes: int = 4) -> SeqLenTimings:
    """One layer's blocks on a modelled device: each block as one layer of the preset roofline."""
    h, s, d, b = shapes.hidden, seq_len, shapes.hidden // shapes.heads, dtype_bytes

    def attention(a: int) -> float:
        w = a * d
        flops = 2 * s * h * 3 * w + 4 * s * s * w + 2 * s * w * h
        return preset.forward_seconds(_cost("attention", "Attention", flops, s * (4 * w + h) * b, 4 * h * w * b), 1, b)

    def mlp(c: int) -> float:
        flops = 4 * s * h * c
        return preset.forward_seconds(_cost("mlp", "MLP", flops, s * (c + h) * b, 2 * h * c * b), 1, b)

    def connective(r: int) -> float:
        return preset.forward_seconds(_cost("connective", "LayerNorm", 10 * r * h, r * h * b, 2 * h * b), 1, b)

    heads, columns, rows = head_grid(shapes.heads), fraction_grid(shapes.intermediate, 8), fraction_grid(s, 4)
    return SeqLenTimings(seq_len=s,
                         attention=BlockGrid(sizes=heads, seconds=[attention(a) for a in heads]),
                         mlp=BlockGrid(sizes=columns, seconds=[mlp(c) for c in columns]),
                         connective=BlockGrid(sizes=rows, seconds=[connective(r) for r in rows]))


# --- measured devices ----------------------------------------------------------------------------------

def measured_device(name: str, records: list[dict[str, Any]], memory: int | None) -> InferenceDevice:
    from hppctl.profiling.device import memory_budget

    identity = next((r for r in records if r.get("type") == "identity"), None)
    blocks = sorted((r for r in records if r.get("type") == "blocks"), key=lambda r: r["seq_len"])
    if identity is None or not blocks:
        raise RuntimeFailure(f"device {name}: the inference-blocks probe returned no measurements")
    timings = [SeqLenTimings(seq_len=r["seq_len"], attention=BlockGrid(**r["attention"]), mlp=BlockGrid(**r["mlp"]),
                             connective=BlockGrid(**r["connective"])) for r in blocks]
    return InferenceDevice(name=name, kind=f"measured:{identity['hostname']}", source="measured",
                           memory_bytes=memory or memory_budget(identity), timings=timings,
                           threads=int(identity["threads"]), cpu_cores=cpu_cores(identity))


def cpu_cores(identity: dict[str, Any]) -> float | None:
    """The cores the device's process may use: its CPU quota, else the CPUs it may run on."""
    quota = identity.get("cpu_quota_cores")
    if quota:
        return float(quota)
    cpus = identity.get("cpus")
    count = len(cpus) if isinstance(cpus, list) else cpus
    return float(count) if count else None


def inference_profile(cluster: ClusterSpec, model: str, seq_lens: Sequence[int], *, layers: int | None = None,
                      dtype_bytes: int = 4, repeats: int = 5, warmup: int = 2, threads: int | None = None,
                      timeout_s: float = 3600.0,
                      on_record: Callable[[str, dict[str, Any]], None] | None = None) -> InferenceProfile:
    """Profile every device of `cluster` for `model` at `seq_lens`. `RuntimeFailure` naming the devices
    that could not be measured (a Galaxy plan needs every device's capacity). Each device's CPU per byte
    of communication needs peers: runtime/galaxy/calibrate.py adds it."""
    from hppctl.profiling.fleet import probe_devices
    from hppctl.profiling.from_presets import preset_devices

    seq_lens = sorted(set(seq_lens))
    if not seq_lens or seq_lens[0] <= 0:
        raise BadInput(f"--seq-len: positive token counts needed, got {list(seq_lens)}")
    shapes = model_shapes(model)
    if layers is not None and not 0 < layers <= shapes.layers:
        raise BadInput(f"--layers: {model} has {shapes.layers} layers (got {layers})")
    presets = preset_devices(cluster)
    args = {"model": model, "seq_lens": seq_lens, "repeats": repeats, "warmup": warmup}
    if threads is not None:
        args["threads"] = threads
    measured, failures = probe_devices(cluster, "inference-blocks", args, imports=[PROBE_MODULE], timeout_s=timeout_s,
                                       on_record=on_record) if any(d.preset is None for d in cluster.devices) else ({}, {})
    if failures:
        raise RuntimeFailure("; ".join(f"device {d}: {why}" for d, why in sorted(failures.items())))
    devices = []
    for spec in cluster.devices:
        if spec.preset is not None:
            preset = presets[spec.name]
            devices.append(InferenceDevice(name=spec.name, kind=spec.preset, source="preset",
                                           memory_bytes=spec.memory or preset.memory_budget_bytes,
                                           timings=[preset_timings(preset, shapes, s, dtype_bytes) for s in seq_lens]))
        else:
            devices.append(measured_device(spec.name, measured[spec.name], spec.memory))
    att, mlp = block_bytes(shapes, dtype_bytes)
    links = [InferenceLink(between=list(link.between), bytes_per_s=link.bandwidth) for link in cluster.links]
    return InferenceProfile(
        source="measured" if measured else "preset", cluster=cluster.name, model=model, family=shapes.family,
        num_layers=layers or shapes.layers, hidden=shapes.hidden, heads=shapes.heads, intermediate=shapes.intermediate,
        dtype_bytes=dtype_bytes, attention_bytes=att, mlp_bytes=mlp,
        embedding_bytes=shapes.embedding_params * dtype_bytes, devices=devices,
        default_bytes_per_s=cluster.bandwidth, links=links)
