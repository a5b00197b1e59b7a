"""Single-process references that `hppctl run` must reproduce (style rule 12, tier 2).

`train_reference`: the whole model on each round's global batch at once (mean cross-entropy), the
plain PyTorch loop. Exact for models without BatchNorm.

`train_sharded_reference`: for BatchNorm models. BatchNorm in training mode normalises over the
samples of one forward call, so under micro-batching and replication its output depends on how a
round is cut. This reference runs the same stage modules in one process on exactly the pieces the
plan gives each device (micro-batch by micro-batch, each device's sample range of each stage), with
a copy of the running statistics per device, averaged over a stage's devices weighted by samples
after every round — the semantics docs/runtime.md states.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F
from torch.func import functional_call

from hppctl.models.plan import HppPlan
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.data import SampleOrder, load_data
from hppctl.runtime.worker import make_optimizer, set_learning_rate
from hppctl.schedule.routing import owned_ranges
from hppctl.zoo import build_stage, get_model


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to `threads` within the block (0: left as they are), as a worker of
    the run being compared sets its own: another thread count sums floats in another order."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _setup(plan: HppPlan, options: TrainOptions, initial: dict | None = None):
    torch.manual_seed(0)
    model = get_model(plan.model).build(seed=options.seed)
    if initial is not None:  # trained weights to start from (`--init-from`), the wrapper's names
        model.load_state_dict(initial)
    model.train()
    data = load_data(options.dataset, plan.model)
    order = SampleOrder(len(data.train), plan.global_batch, plan.micro_batch, options.seed)
    return model, data, order


def train_reference(plan: HppPlan, options: TrainOptions, initial: dict | None = None) -> dict[str, torch.Tensor]:
    model, data, order = _setup(plan, options, initial)
    opt = make_optimizer(model.parameters(), options)
    for r in range(options.rounds):
        set_learning_rate(opt, options.learning_rate(r))
        idx = torch.cat([order.indices(r, m, 0, plan.micro_batch) for m in range(plan.num_micro_batches)])
        x, y = data.train.take(idx)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_sharded_reference(plan: HppPlan, options: TrainOptions,
                            initial: dict | None = None) -> dict[str, torch.Tensor]:
    model, data, order = _setup(plan, options, initial)
    stages = [build_stage(model, plan.granularity, s.start, s.end, mode="train") for s in plan.stages]
    opt = make_optimizer(model.parameters(), options)
    # One copy of each stage's buffers per device of the stage.
    buffers = [[{k: b.detach().clone() for k, b in st.named_buffers()} for _ in s.devices]
               for st, s in zip(stages, plan.stages)]
    G, B = plan.global_batch, plan.micro_batch
    for r in range(options.rounds):
        set_learning_rate(opt, options.learning_rate(r))
        opt.zero_grad()
        for m in range(plan.num_micro_batches):
            x, y = data.train.take(order.indices(r, m, 0, B))
            values = [x]
            for p, (st, s) in enumerate(zip(stages, plan.stages)):
                params = dict(st.named_parameters())
                pieces = []
                for i, (lo, hi) in enumerate(owned_ranges(s.samples)):
                    if hi > lo:
                        shard = [_rows(v, spec_dim, lo, hi, B) for v, spec_dim in zip(values, st.input_batch_dims)]
                        pieces.append(functional_call(st, {**params, **buffers[p][i]}, tuple(shard)))
                values = [torch.cat([piece[j] for piece in pieces]) if st.output_batch_dims[j] == 0 else pieces[0][j]
                          for j in range(len(st.output_names))]
            (F.cross_entropy(values[0], y, reduction="sum") / G).backward()
        opt.step()
        for p, s in enumerate(plan.stages):
            if len(s.devices) > 1:
                _average(buffers[p], s.samples, B)
    for st, per_device in zip(stages, buffers):
        with torch.no_grad():
            for k, b in st.named_buffers():
                b.copy_(per_device[0][k])
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _rows(value: torch.Tensor, batch_dim, lo: int, hi: int, B: int) -> torch.Tensor:
    """Samples [lo, hi) of a micro-batch tensor (a sample owns value.shape[0] / B rows)."""
    if batch_dim is None:
        return value
    rows = value.shape[0] // B
    return value[lo * rows:hi * rows]


def _average(copies: list[dict[str, torch.Tensor]], samples: list[int], B: int) -> None:
    for k in copies[0]:
        if copies[0][k].dtype.is_floating_point:
            mean = sum(c[k] * (y / B) for c, y in zip(copies, samples))
        else:
            mean = torch.stack([c[k] for c in copies]).max(dim=0).values
        for c in copies:
            c[k] = mean.clone()
