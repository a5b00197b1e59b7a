"""Tiny models for tests and smoke runs. `transformers` has nothing this small, so they are written out here.

Module names follow the block convention of the zoo: `blocks.N` are the blocks, everything before the
first block is the stem and everything after the last one the head.
"""

from __future__ import annotations

import torch
from torch import nn


class TinyMLP(nn.Module):
    """`blocks` Linear+ReLU blocks and a linear head."""

    def __init__(self, in_features: int = 32, hidden: int = 64, classes: int = 10, blocks: int = 2) -> None:
        super().__init__()
        widths = [in_features] + [hidden] * blocks
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(widths[i], widths[i + 1]), nn.ReLU()) for i in range(blocks)
        )
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class ResidualBlock(nn.Module):
    """conv-bn-relu-conv-bn, plus the block input, then relu (a ResNet basic block)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.act2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act1(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.act2(y + x)


class TinyCNN(nn.Module):
    """conv stem, one residual block, global average pooling and a linear head."""

    def __init__(self, channels: int = 4, classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU()
        )
        self.blocks = nn.ModuleList([ResidualBlock(channels)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.fc(torch.flatten(self.pool(x), 1))


class TinyVGG(nn.Module):
    """VGG-style CNN (Simonyan & Zisserman): blocks of two 3x3 conv+ReLU and a max-pool, then a fully
    connected classifier (no dropout, no BatchNorm, as VGG-A). Bi-Partition's bench model (the paper
    trained VGG16 on CIFAR-10): convolutions dominate compute, the classifier dominates parameters."""

    def __init__(self, widths: tuple[int, ...] = (16, 32, 64), fc: int = 256, classes: int = 10,
                 in_channels: int = 3, size: int = 32) -> None:
        super().__init__()
        chans = [in_channels, *widths]
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(chans[i], chans[i + 1], 3, padding=1), nn.ReLU(),
                          nn.Conv2d(chans[i + 1], chans[i + 1], 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
            for i in range(len(widths))
        )
        side = size // 2 ** len(widths)
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(nn.Linear(widths[-1] * side * side, fc), nn.ReLU(), nn.Linear(fc, fc),
                                        nn.ReLU(), nn.Linear(fc, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.classifier(self.flatten(x))
