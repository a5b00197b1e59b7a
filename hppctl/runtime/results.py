"""After a run: the whole trained model as one state dict, and its accuracy on the test split.

`save_model` writes the state dict under the model's own names — those of the `transformers`
module (or the tiny model, or the module a user's `--model package.module:factory` returns) inside
hppctl's wrapper, without the wrapper's `model.` prefix — so users load it without hppctl:

    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification
    net = MobileNetV2ForImageClassification(config)      # the config `hppctl models mobilenetv2` describes
    net.load_state_dict(torch.load("model.pt"))
    net = mynet.make(); net.load_state_dict(torch.load("model.pt"))   # a model of your own

Only the model's own state is kept: its parameters and persistent buffers, the names of its
`state_dict()`. The run's stages are `torch.fx` modules that hold every buffer as persistent, so
their joined state also carries the buffers a model registers with `persistent=False` (BERT's
`position_ids` and `token_type_ids`); those are constants the model rebuilds itself, and a strict
`load_state_dict` of the model refuses them.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Callable

from hppctl.store import write_bytes_atomic

WRAPPER_PREFIX = "model."


def own_names(state: dict) -> dict:
    return {k.removeprefix(WRAPPER_PREFIX): v for k, v in state.items()}


def state_names(module) -> list[str]:
    """The names `module.load_state_dict` expects: its parameters and persistent buffers."""
    return list(module.state_dict(keep_vars=True))


def persistent_state(module, state: dict) -> dict:
    """`state` restricted to `module`'s own state names (non-persistent buffers and anything else
    dropped); a name the module expects and `state` lacks is an error, as in a strict load."""
    names = state_names(module)
    missing = [k for k in names if k not in state]
    if missing:
        raise ValueError(f"the trained state lacks {len(missing)} of the model's tensors: "
                         f"{', '.join(missing[:5])}{' …' if len(missing) > 5 else ''}")
    return {k: state[k] for k in names}


def save_model(model: str, state: dict, path: str | Path) -> None:
    """Write the model's own state (see above) of the joined run `state` to `path`."""
    import torch

    from hppctl.zoo import get_model

    meta = get_model(model).build(device="meta")  # only the names: no memory
    buf = io.BytesIO()
    torch.save(own_names(persistent_state(meta, state)), buf)
    write_bytes_atomic(path, buf.getvalue())  # refuses a device or symlink at `path`


def build_trained(model: str, state: dict):
    """The whole model (hppctl's wrapper) with the run's weights, in eval mode."""
    from hppctl.zoo import get_model

    module = get_model(model).build()
    module.load_state_dict(persistent_state(module, state))
    return module.eval()


def recalibrate_batchnorm(model: str, state: dict, split, indices, batch_size: int,
                          on_batch: Callable[[int, int], None] | None = None) -> dict | None:
    """The state with every BatchNorm's running statistics re-estimated over the training samples
    `indices` ("precise BatchNorm"), None for a model without BatchNorm.

    Why: training keeps an exponential average (momentum 0.1) of micro-batch statistics taken while
    the weights still move, over the last ~20 micro-batches only. With a pipeline's small
    micro-batches that average can sit far enough from the trained network's real statistics to cost
    several points of test accuracy (docs/runtime.md, "BatchNorm"). Here the weights are final: each
    layer's mean and variance are the plain average over all the given samples' micro-batches, taken
    in training mode for the BatchNorm layers only (dropout off, as at inference).

    on_batch(samples done, samples in all): after each micro-batch (progress on stderr)."""
    import torch
    from torch.nn.modules.batchnorm import _BatchNorm

    module = build_trained(model, state)
    norms = [m for m in module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    if not norms:
        return None
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # cumulative average
        norm.train()
    with torch.no_grad():
        # a last piece of one sample is dropped: BatchNorm cannot take batch statistics of one sample
        usable = len(indices) - 1 if len(indices) % batch_size == 1 else len(indices)
        for first in range(0, len(indices) - 1, batch_size):
            module(split.take(indices[first:first + batch_size])[0])
            if on_batch is not None:
                on_batch(min(first + batch_size, usable), usable)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def evaluation_batches(split, batch_size: int = 256) -> int:
    """How many batches `accuracy` runs over `split`: a progress bar's total."""
    return -(-len(split) // batch_size)


def accuracy(model: str, state: dict, split, batch_size: int = 256,
             on_batch: Callable[[int, int], None] | None = None) -> float:
    """Top-1 accuracy over `split`; on_batch(batches done, batches in all) after each batch."""
    import torch

    module = build_trained(model, state)
    correct, total = 0, evaluation_batches(split, batch_size)
    with torch.no_grad():
        for n, first in enumerate(range(0, len(split), batch_size)):
            idx = torch.arange(first, min(first + batch_size, len(split)))
            x, y = split.take(idx)
            correct += int((module(x).argmax(dim=1) == y).sum())
            if on_batch is not None:
                on_batch(n + 1, total)
    return correct / len(split)
