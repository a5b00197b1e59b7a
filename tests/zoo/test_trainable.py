"""Every built-in image model can learn from its random initialisation.

Over-fitting one small batch of digits, as the runtime feeds them (runtime/data.py), is the
cheapest check that the gradient reaches every parameter and the loss can fall. efficientnet-b1
once failed it: transformers' N(0, 0.02) init of BatchNorm gammas and convolutions shrank the
activations to ~1e-32 at the logits (hppctl/zoo/init.py), so it learnt nothing under any optimizer.
mobilenetv2, of the same family of networks, is the control.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hppctl.runtime.data import load_data
from hppctl.zoo import get_model

BATCH, STEPS, LEARNING_RATE = 8, 12, 0.001


def first_and_last_loss(name: str) -> tuple[float, float, list[str]]:
    """Adam on one fixed batch; also the parameters the first backward left without gradient."""
    model = get_model(name).build(seed=0).train()
    inputs, labels = load_data("digits", name).train.take(torch.arange(BATCH))
    torch.manual_seed(0)  # the dropout masks
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    losses, without_gradient = [], []
    for step in range(STEPS):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), labels)
        loss.backward()
        if step == 0:
            without_gradient = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
        optimizer.step()
        losses.append(loss.item())
    return losses[0], losses[-1], without_gradient


@pytest.mark.parametrize("name", ["mobilenetv2", "efficientnet-b1"])
def test_overfits_one_batch_of_digits(name):
    first, last, without_gradient = first_and_last_loss(name)
    assert without_gradient == [], f"{name}: no gradient reaches {len(without_gradient)} parameters"
    assert last < 0.25 * first, f"{name}: loss {first:.3f} -> {last:.3f} after {STEPS} Adam steps on one batch"
