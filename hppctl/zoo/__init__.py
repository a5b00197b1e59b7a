"""Built-in DNNs and the model → layer-sequence step.

Public API (docs/zoo.md explains the counting rules):

- `list_models()` -> `ModelInfo` of every built-in model (name, task, parameters, layer counts, input);
- `get_model(name)` -> `ModelSpec` (built-in name or `hf:PATH`), raising `UnknownModel` / `BadInput`;
- `layer_costs(name, granularity)` -> `list[LayerCost]` for the profile (`"fine"` or `"block"`);
- `build_stage(model, granularity, start, end)` -> a module running layers `[start, end)`;
- `trace(name)` -> the traced model (graph, layers, cuts), for tools that need more.

Listing models and reading layer costs of built-ins only reads `hppctl/data/zoo_layers.json`: this
module does not import torch at import time, and neither do those two calls when the table is current.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hppctl.errors import BadInput
from hppctl.zoo.cache import LayerCounts, ModelInfo
from hppctl.zoo.catalog import BUILTINS, ZOO_VERSION, ModelSpec, builtin_names, get_model

if TYPE_CHECKING:
    from hppctl.models.profile import LayerCost
    from hppctl.zoo.layers import TracedModel

GRANULARITIES = ("fine", "block")

__all__ = [
    "GRANULARITIES",
    "ZOO_VERSION",
    "LayerCounts",
    "ModelInfo",
    "ModelSpec",
    "build_stage",
    "builtin_names",
    "cut_values",
    "get_model",
    "layer_costs",
    "list_models",
    "model_info",
    "nested_fine_layers",
    "stage_io",
    "trace",
]


def _entry(spec: ModelSpec) -> dict[str, Any]:
    from hppctl.zoo import cache

    entry = cache.lookup(spec)
    if entry is None:
        from hppctl.zoo.tables import compute_entry

        entry = compute_entry(spec, trace(spec.name, spec.trace_mode))
        cache.store_user(spec, entry)
    return entry


def list_models() -> list[ModelInfo]:
    """Every built-in model, in catalog order (training models first, then inference, then tiny ones)."""
    return [model_info(name) for name in BUILTINS]


def model_info(name: str) -> ModelInfo:
    from hppctl.zoo.cache import info_from_entry

    return info_from_entry(_entry(get_model(name)))


def _check_granularity(granularity: str) -> None:
    if granularity not in GRANULARITIES:
        raise BadInput(f"unknown granularity {granularity!r} (use one of: {', '.join(GRANULARITIES)})")


def layer_costs(name: str, granularity: str) -> list[LayerCost]:
    """Per-layer costs (per sample, fp32) of `name` at `granularity`, in execution order."""
    _check_granularity(granularity)
    from hppctl.zoo.cache import layers_from_entry

    return layers_from_entry(_entry(get_model(name)), granularity)


_TRACES: dict[tuple[str, str, str], Any] = {}


def trace(name: str, mode: str | None = None) -> TracedModel:
    """The model traced on the meta device (cached per process). `mode` is `train` or `eval`; it
    defaults to the model's task (training models keep dropout active in the graph)."""
    spec = get_model(name)
    key = _trace_key(spec, mode)
    if key not in _TRACES:
        _TRACES[key] = _traced(spec, key[2])
    return _TRACES[key]


def is_traced(name: str, mode: str | None = None) -> bool:
    """Whether this process holds `name`'s trace already (a zygote-forked worker inherits its zygote's)."""
    return _trace_key(get_model(name), mode) in _TRACES


def _trace_key(spec: ModelSpec, mode: str | None) -> tuple[str, str, str]:
    return spec.name, spec.fingerprint(), mode or spec.trace_mode


def _traced(spec: ModelSpec, mode: str) -> TracedModel:
    """A zoo model always traces (tests check each); a user model's failure is one `BadInput` line."""
    from hppctl.zoo.layers import TracedModel
    from hppctl.zoo.user import is_user_ref, user_model_failure

    if not is_user_ref(spec.name):
        return TracedModel(spec, mode)
    try:
        return TracedModel(spec, mode)
    except BadInput:
        raise
    except Exception as e:  # noqa: BLE001 - the user's module, run on the meta device
        raise BadInput(user_model_failure(spec, e)) from None


def nested_fine_layers(name: str) -> list[LayerCost] | None:
    """The fine layers, or None for a user model that traced to its blocks only (its block table is all
    there is): what a profile times a block with, when fine layers nest in blocks."""
    from hppctl.zoo.user import is_user_ref

    if is_user_ref(name):
        from hppctl.zoo.cache import refused_granularities

        if "fine" in refused_granularities(_entry(get_model(name))):
            return None
    return layer_costs(name, "fine")


def _module_and_spec(model: Any, mode: str | None) -> tuple[Any, ModelSpec, str]:
    if isinstance(model, str):
        spec = get_model(model)
        mode = mode or spec.trace_mode
        module = spec.build(weights=spec.hf_path is not None)
        module.train(mode == "train")
        return module, spec, mode
    name = getattr(model, "zoo_name", None)
    if name is None:
        raise BadInput("build_stage needs a model name or a module built by ModelSpec.build()")
    return model, get_model(name), mode or ("train" if model.training else "eval")


def build_stage(model: Any, granularity: str, start: int, end: int, *, mode: str | None = None) -> Any:
    """A `torch.fx.GraphModule` running layers `[start, end)` of `model`.

    `model` is a name (the whole model is built with random weights, or the checkpoint's for `hf:`)
    or a module from `ModelSpec.build()`; the stage shares that module's parameters. The stage takes
    the tensors crossing the cut before `start` (its `input_names`; the model input when start = 0)
    as positional arguments and returns a tuple of the tensors crossing the cut after `end - 1`
    (`output_names`; the model output when end = L). `input_batch_dims` / `output_batch_dims` say
    which of them carry the batch in dimension 0 (None: shared by the whole batch, e.g. a mask).
    `mode` picks the trace (`train` keeps functional dropout); it defaults to the module's mode.
    """
    _check_granularity(granularity)
    from hppctl.zoo.stages import build_stage_module

    module, spec, mode = _module_and_spec(model, mode)
    return build_stage_module(trace(spec.name, mode), module, granularity, start, end)


def stage_io(name: str, granularity: str, cut: int, *, mode: str | None = None) -> list[str]:
    """Names of the tensors crossing the cut after layer `cut` (-1: the model input)."""
    return [n.name for n in _cut_nodes(trace(name, mode), granularity, cut)]


def _cut_nodes(traced: TracedModel, granularity: str, cut: int) -> list[Any]:
    _check_granularity(granularity)
    from hppctl.zoo.stages import stage_signature

    count = len(traced.layers(granularity))
    if not -1 <= cut < count:
        raise BadInput(f"{traced.spec.name}: cut {cut} is outside [-1, {count}) at {granularity} granularity")
    if cut == -1:
        return stage_signature(traced, granularity, 0, 1)[0]
    return stage_signature(traced, granularity, 0, cut + 1)[1]


def cut_values(model: Any, granularity: str, cut: int, x: Any, *, mode: str | None = None) -> tuple[Any, ...]:
    """The tensors crossing the cut after layer `cut` when `model` runs on input `x`: the inputs of
    the stage that starts at layer `cut + 1` (a profiler times one layer with them)."""
    import torch.fx

    module, spec, mode = _module_and_spec(model, mode)
    traced = trace(spec.name, mode)
    nodes = _cut_nodes(traced, granularity, cut)
    if cut == -1:
        return (x,)
    targets = set(nodes)
    captured: dict[Any, Any] = {}

    class Capture(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            result = super().run_node(n)
            if n in targets:
                captured[n] = result
            return result

    Capture(torch.fx.GraphModule(module, traced.graph)).run(x)
    return tuple(captured[n] for n in nodes)
