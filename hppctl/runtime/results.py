"""After a run: the whole trained model as one state dict, and its accuracy on the test split.

`save_model` writes the state dict under the model's own names — those of the `transformers`
module (or the tiny model) inside hppctl's wrapper, without the wrapper's `model.` prefix — so
users load it without hppctl:

    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification
    net = MobileNetV2ForImageClassification(config)      # the config `hppctl models mobilenetv2` describes
    net.load_state_dict(torch.load("model.pt"))
"""

from __future__ import annotations

import io
from pathlib import Path

from hppctl.runtime.checkpoint import write_bytes_atomic

WRAPPER_PREFIX = "model."


def own_names(state: dict) -> dict:
    return {k.removeprefix(WRAPPER_PREFIX): v for k, v in state.items()}


def save_model(state: dict, path: str | Path) -> None:
    import torch

    buf = io.BytesIO()
    torch.save(own_names(state), buf)
    write_bytes_atomic(Path(path), buf.getvalue())


def build_trained(model: str, state: dict):
    """The whole model (hppctl's wrapper) with the run's weights, in eval mode."""
    from hppctl.zoo import get_model

    module = get_model(model).build()
    module.load_state_dict(state)
    return module.eval()


def accuracy(model: str, state: dict, split, batch_size: int = 256) -> float:
    import torch

    module = build_trained(model, state)
    correct = 0
    with torch.no_grad():
        for first in range(0, len(split), batch_size):
            idx = torch.arange(first, min(first + batch_size, len(split)))
            x, y = split.take(idx)
            correct += int((module(x).argmax(dim=1) == y).sum())
    return correct / len(split)
