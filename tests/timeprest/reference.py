"""Single-process reference of the asynchronous schedules: the same mathematics, no schedule, no messages.

For mini-batch k (in order) and each of its micro-batches m:
- forward: the whole model at the weight version the head tagged m with (vertical sync: every stage's
  weights after that many of its own updates), stage by stage; keep each stage's input x_s;
- `nf1b` backward: from the tail to the head, recompute stage s with its *latest* weights (after k
  updates) on x_s, back-propagate the gradient of stage s+1's input (tail: the loss, summed
  cross-entropy over N·B), accumulate the weight gradients;
- `pipedream` backward: through the forward graph (the stashed version), gradients added to the
  latest weights';
then one optimizer step per stage. The only input taken from the schedule is the head's version tag
of every micro-batch, so this checks that the runtime routes versions, messages and gradients as the
policy says, with v whatever the schedule makes it.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch.func import functional_call

from hppctl.models.schedule import Schedule
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.data import SampleOrder, load_data
from hppctl.runtime.worker import make_optimizer
from hppctl.zoo import build_stage, get_model


def head_versions(schedule: Schedule) -> dict[int, int]:
    head = schedule.stages[0].devices[0]
    return {a.micro_batch: a.version for a in schedule.actions[head] if a.kind == "F"}


def train_async_reference(model: str, schedule: Schedule, options: TrainOptions, epochs: int) -> dict[str, torch.Tensor]:
    whole = get_model(model).build(seed=options.seed).train()
    stages = [build_stage(whole, "fine", *s.layers, mode="train") for s in schedule.stages]
    optimizers = [make_optimizer(st.parameters(), options) for st in stages]
    data = load_data(options.dataset, model)
    N, B = schedule.micro_batches_per_update, schedule.micro_batch
    K = schedule.num_micro_batches // N
    order = SampleOrder(len(data.train), K * N * B, B, options.seed)
    f_version = head_versions(schedule)
    for epoch in range(epochs):
        history = [[copy.deepcopy(dict(st.named_parameters())) for st in stages]]  # history[u][s]: version u
        for k in range(K):
            for m in range(k * N, (k + 1) * N):
                x, y = data.train.take(order.indices(epoch, m, 0, B))
                _micro_batch(schedule.policy, stages, history, f_version[m], k, x, y, N * B)
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)
            history.append([{n: p.detach().clone() for n, p in st.named_parameters()} for st in stages])
    return {k: v.detach().clone() for k, v in whole.state_dict().items()}


def _micro_batch(policy, stages, history, version, k, x, y, mini_batch) -> None:
    if policy == "pipedream":
        params = [{n: t.detach().clone().requires_grad_(True) for n, t in h.items()} for h in history[version]]
        out = x
        for st, ps in zip(stages, params):
            out = functional_call(st, ps, (out,))[0]
        (F.cross_entropy(out, y, reduction="sum") / mini_batch).backward()
        for st, ps in zip(stages, params):
            for n, live in st.named_parameters():
                live.grad = ps[n].grad.clone() if live.grad is None else live.grad + ps[n].grad
        return
    inputs = [x]
    with torch.no_grad():
        for st, h in zip(stages, history[version]):
            inputs.append(functional_call(st, h, (inputs[-1],))[0])
    grad = None
    for s in reversed(range(len(stages))):
        xin = inputs[s].detach().requires_grad_(s > 0)
        out = stages[s](xin)[0]  # the live (latest) weights: version k of this stage
        if grad is None:
            (F.cross_entropy(out, y, reduction="sum") / mini_batch).backward()
        else:
            out.backward(grad)
        grad = xin.grad
