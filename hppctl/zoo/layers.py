"""Model → layer sequence: trace once, group the graph's nodes into layers, cost every layer.

A *layer* is a run of consecutive graph nodes (the fx graph is in execution order, hence a
topological order). At `block` granularity a layer is one block (a module matching the family's
block pattern: a residual / inverted-residual block or a transformer layer); the nodes before the
first block form `stem`, those after the last block `head`. `fine` splits every block-level layer
further so that each layer holds exactly one leaf-module call; functional nodes (adds, reshapes,
masks) stay with the leaf call before them in the same block, or with the first one when they come
first. Fine layers therefore nest inside block layers: every block cut is also a fine cut.

A *cut* after layer k separates nodes in layers ≤ k (and the model input) from the rest. The values
that cross it are those produced at or before k and used after k; they are what a pipeline stage
boundary must carry (see docs/zoo.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
import torch.fx

from hppctl.errors import BadInput
from hppctl.models.profile import LayerCost
from hppctl.zoo import flops as flops_rules
from hppctl.zoo.catalog import ModelSpec
from hppctl.zoo.spec import USER_FAMILY
from hppctl.zoo.tracing import META_KEY, trace_module

GRANULARITIES = ("fine", "block")
_COMPUTE_OPS = ("call_module", "call_function", "call_method")


@dataclass
class Layer:
    name: str
    kind: str
    nodes: list[torch.fx.Node]
    block: str | None
    """Qualified name of the block module the layer belongs to (None for stem/head)."""


@dataclass
class _Segment:
    key: str | None
    kind: str
    nodes: list[torch.fx.Node] = field(default_factory=list)


def _leaf_flops(module: torch.nn.Module, args: tuple, kwargs: dict) -> int:
    """A block kept whole (its values are real, on the CPU): the FLOPs of the leaf modules it calls,
    counted by running it once with hooks (functional ops inside it are not counted)."""
    total = [0]

    def count(m: torch.nn.Module, inputs: tuple, output: Any) -> None:
        total[0] += flops_rules.module_flops(m, inputs, output)

    leaves = [m for m in module.modules() if not any(True for _ in m.children())]
    handles = [m.register_forward_hook(count) for m in leaves]
    try:
        with torch.no_grad():
            module(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return total[0]


def _short(qualname: str) -> str:
    return qualname[len("model.") :] if qualname.startswith("model.") else qualname


class TracedModel:
    """One model traced on the meta device, with meta values at batch 2 (trace) and batch 1 (costs)."""

    def __init__(self, spec: ModelSpec, mode: str) -> None:
        if mode not in ("train", "eval"):
            raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
        self.spec = spec
        self.mode = mode
        self.root = spec.build(device="meta")
        self.root.train(mode == "train")
        self.fine_refusal: str | None = None
        """Why a user model has no fine layers (its blocks traced, their insides did not); None: it has."""
        self.device = "meta"
        """Where the trace's values live: meta, or cpu for a user model's block trace (its blocks run for real)."""
        self.graph = self._trace(spec.example_input(2, device="meta"))
        self.nodes = list(self.graph.nodes)
        self.position = {node: i for i, node in enumerate(self.nodes)}
        self.values2 = {node: node.meta.get(META_KEY) for node in self.nodes}
        self.values1 = self._propagate(spec.example_input(1, device=self.device))
        self._block_pattern = re.compile(spec.family_info.block_pattern)
        self._lifetimes_of: dict[str, list[tuple[torch.fx.Node, int, int]]] = {}

    def _trace(self, example: torch.Tensor) -> torch.fx.Graph:
        """The graph down to leaf modules; for a user model whose leaves cannot all be traced, down to
        its blocks (top-level children) only, with `fine_refusal` saying why (zoo/user.py)."""
        if self.spec.family != USER_FAMILY:
            return trace_module(self.root, example)
        from hppctl.zoo.user import block_leaves, untraceable

        try:
            return trace_module(self.root, example)
        except Exception as e:  # noqa: BLE001 - the user's forward: any failure is where tracing stopped
            fine_error = e
        # Blocks as single calls, run on real CPU values (a block may branch on its data, which meta
        # tensors do not hold); only the user's top-level forward is traced.
        self.device = "cpu"
        self.root = self.spec.build(device="cpu")
        self.root.train(self.mode == "train")
        try:
            graph = trace_module(self.root, self.spec.example_input(2, device="cpu"), block_leaves)
        except Exception as e:  # noqa: BLE001
            raise BadInput(untraceable(self.spec, e, blocks_traced=False)) from None
        self.fine_refusal = untraceable(self.spec, fine_error, blocks_traced=True)
        return graph

    # --- shape propagation -------------------------------------------------------------------
    def _propagate(self, example: torch.Tensor) -> dict[torch.fx.Node, Any]:
        values: dict[torch.fx.Node, Any] = {}
        module = torch.fx.GraphModule(self.root, self.graph)

        class Recorder(torch.fx.Interpreter):
            def run_node(self, n: torch.fx.Node) -> Any:
                result = super().run_node(n)
                values[n] = result
                return result

        # Eval mode for the leaf modules: BatchNorm refuses one value per channel when training, and
        # shapes do not depend on the mode (the graph itself was traced in `self.mode`).
        self.root.eval()
        try:
            out = Recorder(module).run(example)
        finally:
            self.root.train(self.mode == "train")
        if not isinstance(out, torch.Tensor) or out.shape[0] != 1:
            raise RuntimeError(f"{self.spec.name}: the traced graph does not keep the batch dimension")
        return values

    # --- layers -------------------------------------------------------------------------------
    def _block_of(self, node: torch.fx.Node) -> tuple[str, str] | None:
        stack = node.meta.get("nn_module_stack") or {}
        for key, (qualname, module_type) in stack.items():
            if self._block_pattern.fullmatch(qualname):
                return key, getattr(module_type, "__name__", str(module_type))
        return None

    @cached_property
    def _segments(self) -> list[_Segment]:
        segments: list[_Segment] = []
        for node in self.nodes:
            if node.op not in _COMPUTE_OPS:
                continue
            block = self._block_of(node)
            if block is not None:
                key, kind = block
                if not segments or segments[-1].key != key:
                    segments.append(_Segment(key, kind))
            elif node.op == "call_module":
                if not segments or segments[-1].key is not None:
                    segments.append(_Segment(None, ""))
            elif not segments:
                segments.append(_Segment(None, ""))
            segments[-1].nodes.append(node)
        return segments

    @cached_property
    def _block_layers(self) -> list[Layer]:
        segments = self._segments
        block_positions = [i for i, s in enumerate(segments) if s.key is not None]
        if not block_positions:
            return self._fine_layers  # no block structure: blocks are the leaf calls
        first, last = block_positions[0], block_positions[-1]
        layers = []
        for i, seg in enumerate(segments):
            if seg.key is not None:
                qualname = seg.key.split("@")[0]
                name = _short(seg.key)
                layers.append(Layer(name, seg.kind, seg.nodes, qualname))
            else:
                name = "stem" if i < first else "head" if i > last else f"between.{i}"
                layers.append(Layer(name, name.split(".")[0].capitalize(), seg.nodes, None))
        return layers

    @cached_property
    def _fine_layers(self) -> list[Layer]:
        layers: list[Layer] = []
        for seg in self._segments:
            groups: list[list[torch.fx.Node]] = [[]]
            for node in seg.nodes:
                if node.op == "call_module" and any(n.op == "call_module" for n in groups[-1]):
                    groups.append([])
                groups[-1].append(node)
            for nodes in groups:
                module_node = next((n for n in nodes if n.op == "call_module"), None)
                if module_node is None:
                    name, kind = f"{_short(seg.key or 'ops')}.ops", "functional"
                else:
                    name = _short(str(module_node.target))
                    kind = type(self.root.get_submodule(str(module_node.target))).__name__
                block = seg.key.split("@")[0] if seg.key else None
                layers.append(Layer(name, kind, nodes, block))
        seen: dict[str, int] = {}
        for layer in layers:  # a module called twice gives two layers: name@1, name@2, ...
            count = seen.get(layer.name, 0)
            seen[layer.name] = count + 1
            if count:
                layer.name = f"{layer.name}@{count}"
        return layers

    def layers(self, granularity: str) -> list[Layer]:
        if granularity == "fine":
            if self.fine_refusal is not None:
                raise BadInput(self.fine_refusal)
            return self._fine_layers
        if granularity == "block":
            return self._block_layers
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")

    # --- cuts ---------------------------------------------------------------------------------
    def layer_index(self, granularity: str) -> dict[torch.fx.Node, int]:
        index: dict[torch.fx.Node, int] = {}
        for i, layer in enumerate(self.layers(granularity)):
            for node in layer.nodes:
                index[node] = i
        return index

    def _lifetimes(self, granularity: str) -> list[tuple[torch.fx.Node, int, int]]:
        """(value node, producing layer, last consuming layer) for every value used in a later layer.
        The model input is produced at layer -1; the model output is consumed at layer L.
        Kept per granularity: the graph never changes once traced, and building every stage of a
        plan asks for the crossings of each of its cuts (bert-large fine: 7 s uncached)."""
        if granularity not in self._lifetimes_of:
            self._lifetimes_of[granularity] = self._find_lifetimes(granularity)
        return self._lifetimes_of[granularity]

    def _find_lifetimes(self, granularity: str) -> list[tuple[torch.fx.Node, int, int]]:
        index = self.layer_index(granularity)
        count = len(self.layers(granularity))
        result = []
        for node in self.nodes:
            if node.op == "placeholder":
                produced = -1
            elif node in index:
                produced = index[node]
            else:
                continue  # get_attr (parameters, buffers) and output
            consumers = [count if user.op == "output" else index[user] for user in node.users]
            if consumers and max(consumers) > produced:
                result.append((node, produced, max(consumers)))
        return result

    def crossing(self, granularity: str, cut: int) -> list[torch.fx.Node]:
        """Values that cross the cut after layer `cut` (-1: the model input), in graph order."""
        return [n for n, produced, last in self._lifetimes(granularity) if produced <= cut < last]

    def boundary_bytes(self, granularity: str) -> list[int]:
        """Per sample (batch-1 shapes): bytes crossing the cut after each layer."""
        count = len(self.layers(granularity))
        diff = [0] * (count + 1)
        for node, produced, last in self._lifetimes(granularity):
            size = flops_rules.tensor_bytes(self.values1[node])
            start = max(produced, 0)
            diff[start] += size
            diff[last] -= size
        totals, running = [], 0
        for k in range(count):
            running += diff[k]
            totals.append(running)
        return totals

    # --- costs --------------------------------------------------------------------------------
    def _node_flops(self, node: torch.fx.Node) -> int:
        def value(a: Any) -> Any:
            return torch.fx.node.map_aggregate(a, lambda x: self.values1[x] if isinstance(x, torch.fx.Node) else x)

        args, kwargs, out = value(node.args), value(node.kwargs), self.values1[node]
        if node.op == "call_module":
            module = self.root.get_submodule(str(node.target))
            if any(True for _ in module.children()):  # a user model's block kept whole (block trace)
                return _leaf_flops(module, args, kwargs)
            return flops_rules.module_flops(module, args, out)
        if node.op == "call_function":
            return flops_rules.function_flops(node.target, args, kwargs, out)
        if node.op == "call_method":
            return flops_rules.method_flops(str(node.target), args, out)
        return 0

    def _node_activation_bytes(self, node: torch.fx.Node) -> int:
        if flops_rules.is_view(node.op, node.target):
            return 0
        return flops_rules.tensor_bytes(self.values1[node])

    def layer_costs(self, granularity: str) -> list[LayerCost]:
        layers = self.layers(granularity)
        boundary = self.boundary_bytes(granularity)
        seen_params: set[int] = set()
        costs = []
        for layer, crossing_bytes in zip(layers, boundary):
            param_bytes = 0
            for node in layer.nodes:
                for p in self._params_used(node):
                    if id(p) not in seen_params:
                        seen_params.add(id(p))
                        param_bytes += 4 * p.numel()
            costs.append(
                LayerCost(
                    name=layer.name,
                    kind=layer.kind,
                    boundary_bytes_per_sample=int(crossing_bytes),
                    activation_bytes_per_sample=int(sum(self._node_activation_bytes(n) for n in layer.nodes)),
                    param_bytes=int(param_bytes),
                    forward_flops_per_sample=int(sum(self._node_flops(n) for n in layer.nodes)),
                )
            )
        unused = [p for p in self.root.parameters() if id(p) not in seen_params]
        if unused and costs:
            # Parameters the forward never touches still take memory where the model lives; count
            # them in the last layer so that the layer sum equals the model's parameter bytes.
            last = costs[-1]
            costs[-1] = last.model_copy(update={"param_bytes": last.param_bytes + 4 * sum(p.numel() for p in unused)})
        return costs

    def _params_used(self, node: torch.fx.Node) -> list[torch.nn.Parameter]:
        params: list[torch.nn.Parameter] = []
        if node.op == "call_module":
            params.extend(self.root.get_submodule(str(node.target)).parameters())
        for arg in node.all_input_nodes:
            if arg.op == "get_attr":
                value = self.values2.get(arg)
                if isinstance(value, torch.nn.Parameter):
                    params.append(value)
        return params

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.root.parameters())
