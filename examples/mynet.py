"""A model of your own, as `hppctl --model examples.mynet:make` imports it from the repository root
(docs/zoo.md, "Your own model"): a small residual CNN for 3x32x32 images and 10 classes.

`make()` returns the module alone, so the commands say what one sample is (`--input-shape 3x32x32`);
`make_with_input()` returns it with an example batch, and then no flag is needed."""

import torch
from torch import nn


class Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


class MyNet(nn.Module):
    def __init__(self, channels: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU())
        self.blocks = nn.ModuleList([Residual(channels), Residual(channels)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.fc(torch.flatten(self.pool(x), 1))


def make() -> nn.Module:
    return MyNet()


def make_with_input():
    return MyNet(), torch.randn(1, 3, 32, 32)


class Gate(nn.Module):
    """Branches on its data: torch.fx cannot trace inside it (docs/zoo.md, "What cannot be traced")."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if y.mean() > 0:
            y = torch.relu(y)
        return y


class GatedNet(MyNet):
    def __init__(self) -> None:
        super().__init__()
        self.gate = Gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.gate(self.stem(x))
        for block in self.blocks:
            x = block(x)
        return self.fc(torch.flatten(self.pool(x), 1))


def make_gated():
    """Layers at --granularity block only (the gate is one block, run whole)."""
    return GatedNet(), torch.randn(1, 3, 32, 32)
