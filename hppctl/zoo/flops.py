"""Forward FLOPs and stored activation bytes of one traced node, from its meta values.

Rules (docs/zoo.md has the table):
- a multiply-add is 2 FLOPs; biases are not counted;
- Conv: 2 · out.numel · (in_channels / groups) · kernel volume; Linear (and GPT-2's Conv1D):
  2 · in_features · out.numel; matmul/bmm/baddbmm/`@`: 2 · out.numel · K; scaled-dot-product
  attention: 4 · B·H·L·S·D plus the softmax;
- embeddings, views, indexing, copies and tensor factories: 0;
- every other op that produces a tensor (activations, norms, pooling, softmax, adds, dropout): out.numel.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
from torch import nn

ZERO_FLOP_METHODS = frozenset(
    {
        "view", "reshape", "view_as", "reshape_as", "permute", "transpose", "t", "expand", "expand_as",
        "unsqueeze", "squeeze", "flatten", "unflatten", "split", "chunk", "unbind", "narrow", "select",
        "size", "dim", "numel", "contiguous", "to", "type", "type_as", "float", "half", "bfloat16", "long",
        "int", "bool", "detach", "clone", "repeat", "new_zeros", "new_ones", "new_full", "new_empty",
        "new_tensor", "__getitem__", "masked_fill", "masked_fill_", "fill_", "zero_", "copy_", "index_select",
        "gather", "tolist", "item", "is_floating_point", "cpu", "cuda", "__setitem__", "element_size",
        "storage_offset", "stride", "is_contiguous", "data_ptr", "tril", "triu", "cumsum", "eq", "ne",
        "lt", "le", "gt", "ge", "all", "any", "nonzero", "argmax", "max", "min",
    }
)
"""Methods counted as free: data movement, bookkeeping, or integer/boolean mask work."""

ZERO_FLOP_FUNCTIONS = frozenset(
    {
        getattr, operator.getitem, operator.setitem, torch.flatten, torch.reshape, torch.permute,
        torch.transpose, torch.squeeze, torch.unsqueeze, torch.cat, torch.stack, torch.split, torch.chunk,
        torch.narrow, torch.gather, torch.index_select, torch.where, torch.arange, torch.ones, torch.zeros,
        torch.full, torch.empty, torch.eye, torch.ones_like, torch.zeros_like, torch.full_like,
        torch.empty_like, torch.tensor, torch.tril, torch.triu, torch.cumsum, torch.finfo, torch.iinfo,
        torch.nn.functional.pad, torch.nn.functional.embedding, torch.masked_fill, torch.eq, torch.ne,
        torch.lt, torch.le, torch.gt, torch.ge, torch.logical_and, torch.logical_or, torch.logical_not,
        torch.all, torch.any, operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge,
        operator.and_, operator.or_, operator.invert, operator.not_, operator.neg, len, torch.broadcast_to,
    }
)

VIEW_METHODS = frozenset(
    {
        "view", "reshape", "view_as", "reshape_as", "permute", "transpose", "t", "expand", "expand_as",
        "unsqueeze", "squeeze", "flatten", "unflatten", "split", "chunk", "unbind", "narrow", "select",
        "__getitem__", "detach", "size", "dim",
    }
)
"""Methods whose output aliases their input: they allocate no activation memory."""

VIEW_FUNCTIONS = frozenset(
    {
        getattr, operator.getitem, torch.flatten, torch.reshape, torch.permute, torch.transpose,
        torch.squeeze, torch.unsqueeze, torch.split, torch.chunk, torch.narrow, torch.broadcast_to,
    }
)

_MATMULS = {torch.matmul, torch.bmm, operator.matmul, torch.Tensor.matmul, torch.Tensor.bmm}
_MATMUL_METHODS = {"matmul", "bmm", "__matmul__"}


def tensor_bytes(value: Any) -> int:
    """Bytes of every tensor inside `value` (tensors, tuples, lists, dicts)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    return 0


def _numel(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, (tuple, list)):
        return sum(_numel(v) for v in value)
    return 0


def module_flops(module: nn.Module, args: tuple, out: Any) -> int:
    if isinstance(module, nn.modules.conv._ConvNd):
        kernel = math.prod(module.kernel_size)
        if isinstance(module, nn.modules.conv._ConvTransposeNd):
            return 2 * _numel(args[0]) * (module.out_channels // module.groups) * kernel
        return 2 * _numel(out) * (module.in_channels // module.groups) * kernel
    if isinstance(module, nn.Linear):
        return 2 * module.in_features * _numel(out)
    if type(module).__name__ == "Conv1D" and hasattr(module, "nx"):  # GPT-2's transposed Linear
        return 2 * int(module.nx) * _numel(out)
    if isinstance(module, (nn.Embedding, nn.Identity, nn.Flatten, nn.Unflatten)):
        return 0
    if isinstance(module, (nn.modules.pooling._AdaptiveAvgPoolNd, nn.modules.pooling._AvgPoolNd,
                           nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AdaptiveMaxPoolNd)):
        return _numel(args[0]) if args else _numel(out)
    return _numel(out)


def function_flops(target: Any, args: tuple, kwargs: dict, out: Any) -> int:
    if target in _MATMULS:
        return _matmul_flops(args[0], args[1], out)
    if target is torch.baddbmm or target is torch.addmm or target is torch.addbmm:
        return _matmul_flops(args[1], args[2], out)
    if target is torch.nn.functional.linear:
        weight = args[1] if len(args) > 1 else kwargs["weight"]
        return 2 * int(weight.shape[-1]) * _numel(out)
    if target in (torch.nn.functional.conv1d, torch.nn.functional.conv2d, torch.nn.functional.conv3d, torch.conv2d):
        weight = args[1] if len(args) > 1 else kwargs["weight"]
        return 2 * _numel(out) * int(weight.shape[1]) * math.prod(weight.shape[2:])
    if target is torch.nn.functional.scaled_dot_product_attention:
        q, k = args[0], args[1]
        scores = _numel(q) // q.shape[-1] * k.shape[-2]
        return 4 * scores * q.shape[-1] + scores
    if target is torch.einsum:
        return 2 * _numel(out)  # rare in the zoo; a lower bound
    if target in ZERO_FLOP_FUNCTIONS:
        return 0
    return _numel(out)


def method_flops(name: str, args: tuple, out: Any) -> int:
    if name in _MATMUL_METHODS:
        return _matmul_flops(args[0], args[1], out)
    if name in ("baddbmm", "addmm"):
        return _matmul_flops(args[1], args[2], out)
    if name in ZERO_FLOP_METHODS:
        return 0
    return _numel(out)


def _matmul_flops(a: Any, b: Any, out: Any) -> int:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return _numel(out)
    k = a.shape[-1] if a.dim() > 0 else 1
    return 2 * _numel(out) * int(k)


def is_view(op: str, target: Any) -> bool:
    if op == "call_method":
        return target in VIEW_METHODS or str(target).endswith("_")
    if op == "call_function":
        return target in VIEW_FUNCTIONS or target is operator.setitem
    return False
