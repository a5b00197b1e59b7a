"""Single-process reference for `hppctl psl run` (style rule 12, tier 2).

Each client trains its own copy of the *whole* model (no parts, no helpers, no messages) on the
same samples the runtime gives it, with its own optimizer, for `local_batches` batch updates per
round; at the end of the round every floating state entry becomes the average of the clients'
models weighted by n_j / Σ n (computed here from the shard sizes), and every copy takes it. Split
learning computes the same gradients as the whole model, so the runtime's FedAvg'd model must
equal this one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hppctl.runtime.data import load_data
from hppctl.runtime.psl.config import PslOptions
from hppctl.runtime.psl.data import ClientSamples, shards
from hppctl.runtime.worker import make_optimizer
from hppctl.zoo import get_model


def psl_reference(model: str, batch: int, num_clients: int, options: PslOptions,
                  initial: dict[str, torch.Tensor] | None = None) -> list[dict[str, torch.Tensor]]:
    """Every client's model state after `options.train.rounds` rounds, from `initial` (the model's own
    state names) if given, else from the model built from the seed."""
    train = options.train
    data = load_data(train.dataset, model).train
    parts = shards(len(data), options.shares or [1.0] * num_clients, train.seed)
    weights = [len(p) / len(data) for p in parts]
    models = [get_model(model).build(seed=train.seed).train() for _ in range(num_clients)]
    for m in models if initial is not None else ():
        m.load_state_dict(initial)
    optimizers = [make_optimizer(m.parameters(), train) for m in models]
    samples = [ClientSamples(p, batch, train.seed, j) for j, p in enumerate(parts)]
    for r in range(train.rounds):
        for j, (m, opt) in enumerate(zip(models, optimizers)):
            for k in range(options.local_batches):
                x, y = data.take(samples[j].indices(r * options.local_batches + k))
                opt.zero_grad()
                F.cross_entropy(m(x), y).backward()
                opt.step()
        _average(models, weights)
    return [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in models]


def _average(models: list[torch.nn.Module], weights: list[float]) -> None:
    states = [m.state_dict() for m in models]
    with torch.no_grad():
        for key, value in states[0].items():
            if value.dtype.is_floating_point:
                mean = sum(w * s[key] for w, s in zip(weights, states))
                for s in states:
                    s[key].copy_(mean)
