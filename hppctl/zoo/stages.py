"""Layer ranges as runnable stage modules, cut out of the traced fx graph.

A stage for layers `[start, end)` takes the tensors crossing the cut before `start` (the model input
when start = 0) and returns, as a tuple, the tensors crossing the cut after `end - 1` (the model
output when end = L). Values that pass through untouched (a skip tensor jumping over the whole
stage, an attention mask) are both input and output. Chaining the stages of any partition gives the
model's forward exactly, and autograd runs through them as through the model.

Non-tensor values that cross a cut (sizes, shapes, devices) are not sent: the consumer stage
recreates them. A value that is the same at batch 1 and 2 becomes a constant; an int (or a tuple of
ints) that grows linearly with the batch is recomputed from the batch size of the first batched
input tensor; a device is read from an input tensor.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from hppctl.errors import BadInput
from hppctl.zoo.layers import TracedModel


class StageError(BadInput):
    """A layer range that cannot become a stage."""


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def batch_dim(traced: TracedModel, node: torch.fx.Node) -> int | None:
    """0 when dimension 0 is batch-major (its size is proportional to the batch: (B, …) or a
    flattened (B·S, …)), so that sample i owns an equal contiguous block of it; None otherwise
    (a value shared by the whole batch, such as position ids of shape (1, S))."""
    rows = _rows_per_sample(traced, node)
    return 0 if rows else None


def _rows_per_sample(traced: TracedModel, node: torch.fx.Node) -> int:
    v1, v2 = traced.values1[node], traced.values2[node]
    if not (_is_tensor(v1) and _is_tensor(v2)) or v1.dim() == 0 or v1.dim() != v2.dim():
        return 0
    if v2.shape[0] != 2 * v1.shape[0] or v1.shape[0] == 0 or v1.shape[1:] != v2.shape[1:]:
        return 0
    return int(v1.shape[0])


def _same_constant(a: Any, b: Any) -> bool:
    if _is_tensor(a) or _is_tensor(b):
        return False
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same_constant(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) or isinstance(b, dict):
        return False
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def _plain(value: Any) -> Any:
    """torch.Size → tuple, so that the generated code needs no torch.Size constructor."""
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def stage_signature(traced: TracedModel, granularity: str, start: int, end: int) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    count = len(traced.layers(granularity))
    if not (0 <= start < end <= count):
        raise StageError(f"{traced.spec.name}: layer range [{start}, {end}) is not inside [0, {count}) at {granularity} granularity")
    inputs = [n for n in traced.crossing(granularity, start - 1) if _tensor_valued(traced, n)]
    outputs = [n for n in traced.crossing(granularity, end - 1) if _tensor_valued(traced, n)]
    return inputs, outputs


def _tensor_valued(traced: TracedModel, node: torch.fx.Node) -> bool:
    value = traced.values2[node]
    if _is_tensor(value):
        return True
    if isinstance(value, (tuple, list)) and any(_is_tensor(v) for v in value):
        raise StageError(
            f"{traced.spec.name}: a tuple of tensors ({node.name}) crosses a cut; cut elsewhere or use block granularity"
        )
    return False


def build_stage_module(traced: TracedModel, root: torch.nn.Module, granularity: str, start: int, end: int) -> torch.fx.GraphModule:
    layers = traced.layers(granularity)
    inputs, outputs = stage_signature(traced, granularity, start, end)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, Any] = {}
    attrs: dict[str, torch.fx.Node] = {}

    for node in inputs:
        placeholder = graph.placeholder(node.name)
        placeholder.meta = dict(node.meta)
        env[node] = placeholder
    batched = [(env[n], _rows_per_sample(traced, n)) for n in inputs if _rows_per_sample(traced, n)]
    batch_size: list[torch.fx.Node] = []

    def batch_node() -> torch.fx.Node:
        if not batched:
            raise StageError(f"{traced.spec.name}: stage [{start}, {end}) has no batched input to read the batch size from")
        if not batch_size:
            tensor, rows = min(batched, key=lambda item: item[1])
            size = graph.call_method("size", (tensor, 0))
            batch_size.append(graph.call_function(operator.floordiv, (size, rows)) if rows != 1 else size)
        return batch_size[0]

    def rematerialize(node: torch.fx.Node) -> Any:
        v1, v2 = traced.values1[node], traced.values2[node]
        if isinstance(v2, torch.device):
            source = next(iter(env[n] for n in inputs), None)
            if source is None:
                raise StageError(f"{traced.spec.name}: no input tensor to take the device from")
            return graph.call_function(getattr, (source, "device"))
        if _same_constant(v1, v2):
            return _plain(v2)
        return _linear_in_batch(node, v1, v2)

    def _linear_in_batch(node: torch.fx.Node, v1: Any, v2: Any) -> Any:
        if isinstance(v1, bool) or isinstance(v2, bool):
            raise StageError(f"{traced.spec.name}: value {node.name} depends on the batch size and cannot cross a cut")
        if isinstance(v1, int) and isinstance(v2, int):
            delta = v2 - v1
            if delta == 0:
                return v1
            scaled = graph.call_function(operator.mul, (batch_node(), delta)) if delta != 1 else batch_node()
            offset = v1 - delta
            return graph.call_function(operator.add, (scaled, offset)) if offset else scaled
        if isinstance(v1, tuple) and isinstance(v2, tuple) and len(v1) == len(v2):
            return tuple(_linear_in_batch(node, a, b) for a, b in zip(v1, v2))
        raise StageError(
            f"{traced.spec.name}: non-tensor value {node.name} ({type(v2).__name__}) changes with the batch size "
            f"and crosses the cut; choose another cut"
        )

    def lookup(node: torch.fx.Node) -> Any:
        if node in env:
            return env[node]
        if node.op == "get_attr":
            target = str(node.target)
            if target not in attrs:
                attrs[target] = graph.get_attr(target)
            return attrs[target]
        value = traced.values2[node]
        if _is_tensor(value):
            raise StageError(f"{traced.spec.name}: tensor {node.name} is used in stage [{start}, {end}) but not passed to it")
        env[node] = rematerialize(node)
        return env[node]

    for layer in layers[start:end]:
        for node in layer.nodes:
            env[node] = graph.node_copy(node, lookup)
    graph.output(tuple(env[n] for n in outputs))
    graph.lint()

    module = torch.fx.GraphModule(root, graph, class_name=f"Stage_{start}_{end}")
    module.input_names = [n.name for n in inputs]
    module.output_names = [n.name for n in outputs]
    module.input_batch_dims = [batch_dim(traced, n) for n in inputs]
    module.output_batch_dims = [batch_dim(traced, n) for n in outputs]
    module.layer_range = (start, end)
    module.granularity = granularity
    return module
