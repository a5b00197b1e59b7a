"""Symbolic tracing with meta-tensor shape propagation.

`torch.fx.symbolic_trace` alone fails on Hugging Face models: their Python code branches on shapes
(`if seq_len > ...`, `int(...)` of a padding size), iterates over sizes and calls factory functions
(`torch.ones(batch, seq)`) with traced values. `MetaTracer` runs every recorded op a second time on
meta tensors as it traces, so each proxy carries its concrete value: control flow, `len`, `int` and
iteration use that value, while the op itself stays in the graph with symbolic inputs. Sizes read
from tensors therefore stay symbolic (a graph traced at batch 2 runs at any batch size), and only
values Python forces into constants (`int(x)`, `if`) are baked, for the traced input shape.

Leaf modules are modules without children: each becomes one `call_module` node.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx
from torch.fx.proxy import Attribute, Proxy, TraceError

META_KEY = "hpp_meta"

_FACTORIES = ("arange", "ones", "zeros", "full", "empty", "eye", "rand", "randn", "randint", "tensor")
"""torch functions whose integer arguments may be traced sizes: the argument parser rejects proxies there."""

_CONCRETE_ATTRS = frozenset({"dtype", "is_meta", "is_cuda", "is_sparse", "layout"})
"""Tensor attributes read as constants (`torch.finfo(x.dtype)` needs a real dtype)."""

_MUTATING_FUNCTIONS = {operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv}


def to_meta(a: Any) -> Any:
    """Replace every proxy inside `a` by the value it carries."""
    if isinstance(a, Proxy):
        return a.node.meta[META_KEY]
    if isinstance(a, torch.fx.Node):
        return a.meta[META_KEY]
    if isinstance(a, torch.Size):
        return torch.Size([to_meta(x) for x in a])
    if isinstance(a, tuple):
        values = [to_meta(x) for x in a]
        return type(a)(*values) if hasattr(a, "_fields") else tuple(values)
    if isinstance(a, list):
        return [to_meta(x) for x in a]
    if isinstance(a, dict):
        return {k: to_meta(v) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(to_meta(a.start), to_meta(a.stop), to_meta(a.step))
    return a


def _has_proxy(a: Any) -> bool:
    if isinstance(a, Proxy):
        return True
    if isinstance(a, (tuple, list)):
        return any(_has_proxy(x) for x in a)
    if isinstance(a, dict):
        return any(_has_proxy(x) for x in a.values())
    if isinstance(a, slice):
        return _has_proxy(a.start) or _has_proxy(a.stop) or _has_proxy(a.step)
    return False


class _MetaValueMixin:
    """Python protocol methods answered from the traced value."""

    node: torch.fx.Node

    @property
    def _meta(self) -> Any:
        return self.node.meta[META_KEY]

    def __bool__(self) -> bool:
        # any device: a user model's block trace carries real CPU values, which must not be baked either
        if isinstance(self._meta, torch.Tensor):
            raise TraceError(f"control flow depends on tensor data ({self.node.format_node()})")
        return bool(self._meta)

    def __len__(self) -> int:
        return len(self._meta)

    def __iter__(self) -> Any:
        value = self._meta
        if isinstance(value, dict):
            return iter(value)
        return iter([self[i] for i in range(len(value))])  # type: ignore[index]

    def __int__(self) -> int:
        self._refuse_tensor_value("int")
        return int(self._meta)

    def __float__(self) -> float:
        self._refuse_tensor_value("float")
        return float(self._meta)

    def _refuse_tensor_value(self, what: str) -> None:
        if isinstance(self._meta, torch.Tensor):
            raise TraceError(f"{what}() of tensor data ({self.node.format_node()})")

    def __contains__(self, key: Any) -> bool:
        return key in self._meta

    def keys(self) -> Any:
        return self._meta.keys()

    def __getattr__(self, name: str) -> Any:
        if name in _CONCRETE_ATTRS:
            return getattr(self._meta, name)
        return MetaAttribute(self, name)  # type: ignore[arg-type]


class MetaProxy(_MetaValueMixin, Proxy):
    pass


class MetaAttribute(_MetaValueMixin, Attribute):
    pass


class MetaTracer(torch.fx.Tracer):
    """fx tracer that keeps a meta value on every node (`node.meta["hpp_meta"]`)."""

    def __init__(self, inputs: dict[str, torch.Tensor],
                 leaves: Callable[[torch.nn.Module, str], bool] | None = None) -> None:
        super().__init__(autowrap_modules=(), param_shapes_constant=False)
        self.inputs = inputs
        self.leaves = leaves
        self.proxy_buffer_attributes = True
        self._executing = False

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        if self.leaves is not None and self.leaves(m, module_qualified_name):
            return True  # a whole block as one call (a user model's block trace)
        return all(child is None for child in m._modules.values())

    def call_module(self, m: torch.nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
        if self._executing:
            return forward(*args, **kwargs)
        try:
            self.path_of_module(m)
        except NameError:
            # A module created inside forward (`nn.ReLU()(x)`): trace through it.
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        if self._executing:
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def proxy(self, node: torch.fx.Node) -> Proxy:
        return MetaProxy(node, self)

    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None, proxy_factory_fn=None):  # type: ignore[no-untyped-def]
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        if kind == "placeholder":
            value = self.inputs[target]
        else:
            self._executing = True
            try:
                value = self._evaluate(kind, target, to_meta(args), to_meta(kwargs))
            finally:
                self._executing = False
        proxy.node.meta[META_KEY] = value
        return proxy

    def _evaluate(self, kind: str, target: Any, args: tuple, kwargs: dict) -> Any:
        if kind == "call_function":
            return target(*args, **kwargs)
        if kind == "call_method":
            return getattr(args[0], target)(*args[1:], **kwargs)
        if kind == "call_module":
            return self.root.get_submodule(target)(*args, **kwargs)
        if kind == "get_attr":
            obj: Any = self.root
            for part in target.split("."):
                obj = getattr(obj, part)
            return obj
        return None

    def trace(self, root: Any, concrete_args: Any = None) -> torch.fx.Graph:
        originals = {name: getattr(torch, name) for name in _FACTORIES}

        def traced_factory(original: Any) -> Any:
            def factory(*args: Any, **kwargs: Any) -> Any:
                if not self._executing and (_has_proxy(args) or _has_proxy(kwargs)):
                    return self.create_proxy("call_function", original, args, kwargs)
                return original(*args, **kwargs)

            return factory

        try:
            for name, original in originals.items():
                setattr(torch, name, traced_factory(original))
            return super().trace(root, concrete_args)
        finally:
            for name, original in originals.items():
                setattr(torch, name, original)


def is_mutating(node: torch.fx.Node) -> bool:
    if node.op == "call_method":
        return str(node.target).endswith("_") and not str(node.target).endswith("__")
    if node.op == "call_function":
        return node.target in _MUTATING_FUNCTIONS or getattr(node.target, "__name__", "").endswith("_")
    return node.op == "call_module"  # modules may update buffers (BatchNorm): never dropped


def eliminate_dead_code(graph: torch.fx.Graph) -> None:
    """Drop nodes nobody uses (unused model outputs, cache bookkeeping), keeping mutations."""
    changed = True
    while changed:
        changed = False
        for node in reversed(list(graph.nodes)):
            if node.op in ("placeholder", "output") or node.users or is_mutating(node):
                continue
            graph.erase_node(node)
            changed = True


def trace_module(module: torch.nn.Module, example: torch.Tensor,
                 leaves: Callable[[torch.nn.Module, str], bool] | None = None) -> torch.fx.Graph:
    """Trace `module(x)` with `example` (a meta tensor) into a graph whose nodes carry meta values.
    `leaves(module, qualified name)` marks further modules to keep as single calls."""
    tracer = MetaTracer({"x": example}, leaves)
    graph = tracer.trace(module)
    eliminate_dead_code(graph)
    for node in graph.nodes:
        if node.op == "get_attr" and node.target.startswith("_tensor_constant"):
            raise TraceError(
                f"tracing baked a tensor constant ({node.format_node()}); the graph could not run on a real model"
            )
        _check_no_meta_device(node)
    return graph


def _check_no_meta_device(node: torch.fx.Node) -> None:
    found: list[Any] = []

    def visit(a: Any) -> Any:
        if isinstance(a, torch.device) and a.type == "meta":
            found.append(a)
        return a

    torch.fx.node.map_aggregate(node.args, visit)
    torch.fx.node.map_aggregate(node.kwargs, visit)
    if found:
        raise TraceError(f"tracing baked the meta device into {node.format_node()}")
