"""One worker's stage: the layer range cut out of the model, and the tensors that cross its two cuts.

Every worker builds the whole model from the run's seed (so every stage starts from the same
weights a single process would have), cuts its layer range out with `hppctl.zoo.build_stage`, and
drops the rest: the stage module keeps only the submodules its layers use. Parameter and buffer
names are the model's own (`model.blocks.0.conv1.weight`), so stage state dicts join into the
whole model's.

A `TensorSpec` describes one tensor crossing a cut, per sample: tensors with the batch in
dimension 0 are split by sample index (a sample owns `rows` consecutive rows: 1 for (B, …),
S for OPT's flattened (B·S, …)); tensors shared by the whole batch (position ids) travel whole on
every route. Gradients travel back for every batched floating tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from hppctl.errors import BadInput


@dataclass(frozen=True)
class TensorSpec:
    name: str
    rows: int | None
    """Rows of dimension 0 per sample; None for a tensor shared by the whole batch."""
    shape: tuple[int, ...]
    """Batched: the dimensions after dimension 0. Shared: the whole shape."""
    dtype: torch.dtype

    @property
    def batched(self) -> bool:
        return self.rows is not None

    @property
    def carries_grad(self) -> bool:
        return self.batched and self.dtype.is_floating_point

    def empty(self, samples: int, pinned: bool = False) -> torch.Tensor:
        """A host buffer for `samples` samples (page-locked with `pinned`: accelerator.pinned_for)."""
        if self.rows is None:
            return torch.empty(self.shape, dtype=self.dtype, pin_memory=pinned)
        return torch.empty((self.rows * samples, *self.shape), dtype=self.dtype, pin_memory=pinned)

    def rows_of(self, tensor: torch.Tensor, first: int, last: int) -> torch.Tensor:
        """Samples [first, last) counted from the tensor's first sample (shared tensors whole)."""
        if self.rows is None:
            return tensor
        return tensor[first * self.rows:last * self.rows]

    def nbytes(self, samples: int) -> int:
        count = 1
        for n in self.shape:
            count *= n
        if self.rows is not None:
            count *= self.rows * samples
        return count * self.dtype.itemsize


def _spec(name: str, value: torch.Tensor, batch_dim: int | None) -> TensorSpec:
    if batch_dim is None:
        return TensorSpec(name, None, tuple(value.shape), value.dtype)
    return TensorSpec(name, int(value.shape[0]), tuple(value.shape[1:]), value.dtype)


def cut_specs(traced, module) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The specs of the tensors entering and leaving `module`, cut out of the `traced` model by `build_stage`."""
    by_name = {n.name: n for n in traced.nodes}

    def specs(names, batch_dims) -> list[TensorSpec]:
        return [_spec(n, traced.values1[by_name[n]], d) for n, d in zip(names, batch_dims)]

    return specs(module.input_names, module.input_batch_dims), specs(module.output_names, module.output_batch_dims)


def backward_into(outputs: Sequence[torch.Tensor], specs: Sequence[TensorSpec], grads: Sequence[torch.Tensor]) -> None:
    """Back-propagate `grads`, one per output whose spec carries a gradient (outputs the graph does not
    reach, which need none, are left out)."""
    carried = [o for o, s in zip(outputs, specs) if s.carries_grad]
    pairs = [(o, g.to(o.dtype)) for o, g in zip(carried, grads) if o.requires_grad]  # autocast: o may be in half
    if pairs:
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])


def input_grads(values: Sequence[torch.Tensor], specs: Sequence[TensorSpec]) -> list[torch.Tensor]:
    """The gradients that reached a part's inputs, for those whose spec carries one (zeros where none did)."""
    return [v.grad if v.grad is not None else torch.zeros_like(v) for v, s in zip(values, specs) if s.carries_grad]


def stage_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by name, non-persistent buffers included (a state dict omits those)."""
    tensors = {k: v.detach().clone() for k, v in module.named_parameters()}
    tensors.update({k: v.detach().clone() for k, v in module.named_buffers()})
    return tensors


def initial_stage_tensors(model: str, granularity: str, layers: Sequence[tuple[int, int]], *,
                          seed: int, state: dict[str, torch.Tensor] | None = None) -> list[dict[str, torch.Tensor]]:
    """What each stage starts from: the whole model built from `seed` (as a single process would),
    with the trained `state` loaded over it if given (`--init-from`: every parameter and persistent
    buffer, checked by runtime/warmstart.py), cut into the plan's layer ranges. The launcher builds it
    once and ships each stage its part, so no worker ever holds the whole model."""
    from hppctl.zoo import build_stage, get_model

    whole = get_model(model).build(seed=seed).train()
    if state is not None:
        whole.load_state_dict(state)  # strict: warmstart.py gave exactly the model's state names
    return [stage_tensors(build_stage(whole, granularity, a, b, mode="train")) for a, b in layers]


class Stage:
    """The stage module of layers [start, end) with the specs of its inputs and outputs.

    With `tensors` (from `initial_stage_tensors`), the module is cut out of a model on the meta
    device and only its own tensors are allocated; without, the whole model is built from `seed`
    and cut (tests and references)."""

    def __init__(self, model: str, granularity: str, start: int, end: int, *, seed: int = 0,
                 tensors: dict[str, torch.Tensor] | None = None, device: torch.device | None = None) -> None:
        from hppctl.zoo import build_stage, get_model, trace

        spec = get_model(model)
        if spec.task != "train":
            raise BadInput(f"model {model!r} is an inference model; `hppctl run` trains ({spec.task})")
        whole = (spec.build(seed=seed) if tensors is None else spec.build(device="meta")).train()
        self.module = build_stage(whole, granularity, start, end, mode="train")
        del whole
        if tensors is not None:
            _assign(self.module, tensors)
        self.device = device or torch.device("cpu")
        """Where the stage computes and its parameters (and so the optimizer's state) live."""
        self.module.to(self.device)  # in place, same Parameter objects; no copy on the CPU
        self.start, self.end = start, end
        self.inputs, self.outputs = cut_specs(trace(model, "train"), self.module)
        for s in (*self.inputs, *self.outputs):
            if not s.batched and s.dtype.is_floating_point:
                # A float tensor shared by the batch would need its gradient summed over routes; no
                # built-in training model has one at any cut.
                raise BadInput(f"{model}: tensor {s.name} crossing a cut of [{start}, {end}) has no batch "
                               f"dimension; choose other cut points")

    def __call__(self, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.module(*values)

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.module.parameters())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Host copies (a checkpoint or the final model is read where there may be no accelerator)."""
        return {k: host_copy(v) for k, v in self.module.state_dict().items()}


def host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A detached copy in host memory: a clone on the CPU, the device-to-host copy elsewhere."""
    tensor = tensor.detach()
    return tensor.clone() if tensor.device.type == "cpu" else tensor.to("cpu")


def join(specs: Sequence[TensorSpec], pieces: Sequence[tuple[int, Sequence[torch.Tensor]]]) -> list[torch.Tensor]:
    """Concatenate pieces `(first sample, tensors)` in sample order; shared tensors come from the first."""
    ordered = [tensors for _, tensors in sorted(pieces, key=lambda p: p[0])]
    out = []
    for i, spec in enumerate(specs):
        if spec.batched:
            parts = [t[i] for t in ordered]
            out.append(parts[0] if len(parts) == 1 else torch.cat(parts))
        else:
            out.append(ordered[0][i])
    return out


def _assign(module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Put the given tensors in place of the meta ones (no copy: the stage owns them from now on)."""
    names = [k for k, _ in module.named_parameters()] + [k for k, _ in module.named_buffers()]
    missing = sorted(set(names) - set(tensors))
    if missing:
        raise ValueError(f"initial state lacks {missing[:5]}{' …' if len(missing) > 5 else ''}")
    assign_by_name(module, {name: tensors[name] for name in names})


def assign_by_name(module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Put `tensors` into `module` (a meta one) by their names: a parameter stays a parameter (with its
    `requires_grad`), a buffer a buffer. Every part built from a whole model so filled shares them."""
    params = dict(module.named_parameters())
    for name, tensor in tensors.items():
        owner_name, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_name)
        if name in params:
            setattr(owner, attr, torch.nn.Parameter(tensor, requires_grad=params[name].requires_grad))
        else:
            owner._buffers[attr] = tensor
