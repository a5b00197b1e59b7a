"""User datasets for `--dataset tests.runtime.userdata:…` in the runtime tests."""

from __future__ import annotations

import sys

import torch
from torch.utils.data import Dataset


class Features(Dataset):
    """64 samples of 32 features; label = index mod 10. `fail_in_workers` makes every read inside a
    worker process fail (the launcher's pre-flight read still succeeds)."""

    def __init__(self, fail_in_workers: bool = False) -> None:
        self.fail_in_workers = fail_in_workers

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        if self.fail_in_workers and sys.argv[0].endswith("worker.py"):
            raise RuntimeError(f"sample {i} is unreadable on this device")
        return torch.full((32,), float(i) / 64), i % 10


def features():
    return Features(), Features()


def broken_in_workers():
    return Features(fail_in_workers=True)


def wrong_shape():
    return [(torch.zeros(7), 0)]


class SlowFeatures(Features):
    """Reads take 5 ms inside workers, so a short run lasts long enough to be killed in the middle."""

    def __getitem__(self, i: int):
        if sys.argv[0].endswith("worker.py"):
            import time

            time.sleep(0.005)
        return super().__getitem__(i)


def slow_features():
    return SlowFeatures()


class Tokens(Dataset):
    """`count` sequences of 16 token ids below 100; label = whether the first id is even (for tiny-bert
    and small `hf:` BERTs: 2 classes, sequences of 16)."""

    def __init__(self, count: int, offset: int) -> None:
        self.count, self.offset = count, offset

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        ids = (torch.arange(16) * 7 + 3 * (i + self.offset)) % 100
        return ids, int(ids[0]) % 2


def tokens():
    return Tokens(64, 0), Tokens(24, 64)
