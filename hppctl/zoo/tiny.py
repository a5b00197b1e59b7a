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
