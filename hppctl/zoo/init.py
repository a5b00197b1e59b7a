"""Random initialisation of built-in models where the Hugging Face default cannot train from scratch.

`transformers`' EfficientNet initialises every Conv2d weight *and every BatchNorm weight (gamma)*
from N(0, 0.02) (`EfficientNetPreTrainedModel._init_weights`, written for loading checkpoints, not
for training from scratch). With BatchNorm eps = 1e-3 a BatchNorm cannot rescale a signal whose
variance is far below 1e-3: it multiplies it by about gamma / sqrt(eps) ≈ 0.6, and each convolution
before it by about 0.02·sqrt(fan-in) < 1. Through efficientnet-b1's 23 blocks the activations fall
to ~1e-32 at the logits, which are therefore the same for every sample, and the gradients of 250 of
its 301 parameter tensors are exactly zero: the model learns nothing under any optimizer.

The reference EfficientNet (Tan & Le 2019; its TF code and torchvision's port) initialises
convolutions with He-normal (fan-out), BatchNorm with gamma = 1 and beta = 0, and the classifier
uniformly in ±1/sqrt(classes). That is what `reinitialise` does: the architecture, the parameter
names and the layer table do not change, only the starting values.
"""

from __future__ import annotations

import math

import torch
from torch import nn

@torch.no_grad()
def reference_efficientnet_init(model: nn.Module) -> None:
    """Initialise like the reference EfficientNet (torchvision.models.efficientnet does the same)."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            bound = 1.0 / math.sqrt(module.out_features)
            nn.init.uniform_(module.weight, -bound, bound)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


def reinitialise(family: str, model: nn.Module) -> None:
    """Replace transformers' random initialisation where it cannot train (see the module docstring)."""
    if family == "efficientnet":
        reference_efficientnet_init(model)
