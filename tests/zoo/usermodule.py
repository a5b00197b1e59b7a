"""A model of the user's own for the tests: written into a temporary directory as a module of a fresh
name (so that no two tests share an imported module), and imported from there as `--model` would.

`RESNET` is a small CNN with a residual branch, dropout-free and without BatchNorm (training it under
any plan gives the same parameters as one device, exactly up to float rounding)."""

from __future__ import annotations

import uuid
from pathlib import Path

RESNET = '''
import torch
from torch import nn


class Residual(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.act2 = nn.ReLU()

    def forward(self, x):
        return self.act2(self.conv2(self.act1(self.conv1(x))) + x)


class SmallResNet(nn.Module):
    def __init__(self, channels=6, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.ReLU())
        self.blocks = nn.ModuleList([Residual(channels), Residual(channels)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.classifier(torch.flatten(self.pool(x), 1))


class WideHead(nn.Module):
    """The residual CNN with a fully connected head of three equal parts (about 50 k parameters each;
    the convolutions have 3 k): with a memory budget for one part per device, three single-device
    stages are the only plan that fits three devices."""

    def __init__(self, channels=6, hidden=128, wide=384, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.ReLU())
        self.blocks = nn.ModuleList([Residual(channels), Residual(channels)])
        self.flatten = nn.Flatten()
        self.fc1 = nn.Sequential(nn.Linear(channels * 8 * 8, hidden), nn.ReLU())
        self.fc2 = nn.Sequential(nn.Linear(hidden, wide), nn.ReLU())
        self.fc3 = nn.Sequential(nn.Linear(wide, hidden), nn.ReLU())
        self.classifier = nn.Linear(hidden, classes)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.classifier(self.fc3(self.fc2(self.fc1(self.flatten(x)))))


def make():
    return SmallResNet(), torch.randn(2, 3, 8, 8)


def make_wide():
    return WideHead(), torch.randn(2, 3, 8, 8)


def bare():
    return SmallResNet()


def with_attribute():
    net = SmallResNet()
    net.input_shape = (3, 8, 8)
    return net
'''

BROKEN = '''
import torch
from torch import nn


class Gate(nn.Module):
    """Branches on its data: fx cannot trace inside it, but it runs whole."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        if y.mean() > 0:
            y = y * 2
        return y


class GatedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = Gate()
        self.head = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.gate(x), 1))


class TopLevelBranch(GatedNet):
    def forward(self, x):
        y = self.gate(x)
        if y.sum() > 0:
            y = -y
        return self.head(torch.flatten(y, 1))


def gated():
    return GatedNet(), torch.randn(1, 3, 8, 8)


def top_level_branch():
    return TopLevelBranch(), torch.randn(1, 3, 8, 8)


def not_a_module():
    return {"weights": 1}


def raises():
    raise RuntimeError("cannot find weights.pt")


def needs_arguments(width):
    return GatedNet()


def example_not_a_tensor():
    return GatedNet(), [1, 2, 3]


def example_without_batch():
    return GatedNet(), torch.randn(8)


def float64_example():
    return GatedNet(), torch.randn(1, 3, 8, 8, dtype=torch.float64)


def tuple_output():
    class Pair(GatedNet):
        def forward(self, x):
            y = self.head(torch.flatten(self.gate.conv(x), 1))
            return y, y

    return Pair(), torch.randn(1, 3, 8, 8)


not_callable = 42
'''


def write_module(directory: Path, source: str = RESNET) -> str:
    """Write `source` as a fresh module in `directory` and return its name. The tests run from
    `directory` (monkeypatch.chdir): hppctl imports it from the current directory, as for a user."""
    name = f"usernet_{uuid.uuid4().hex[:10]}"
    (directory / f"{name}.py").write_text(source)
    return name
