"""Captured probe outputs (tests/data/profiling/), recorded on this project's edge lab and CI machine.

    identify-lab-h3.jsonl          `identify` on a 0.25-core lab host (cgroup files hidden: duty cycle)
    identify-local.jsonl           `identify` on the CI machine itself (no quota)
    train-tiny-cnn-lab-h2.jsonl    `train` tiny-cnn, batch 1, 4, 16, 5 repeats, on a 0.5-core lab host
    train-mobilenetv2-lab-h1.jsonl `train` mobilenetv2, batch 1, 8, 3 repeats, on a 1-core lab host
                                   (batch 1 needs eval-mode BatchNorm: a note says so)
    train-killed-lab-h1.jsonl      `train` mobilenetv2 at batch 2 and 1024 on a 1 GB host: killed by the
                                   kernel in the memory phase of batch 1024 (fabric reports exit -1)
    train-error.jsonl              `train` of an unknown model: an error record, exit 1
    recv-/send-/echo-/ping-*.jsonl one link measurement between two 100 Mbit/s lab hosts
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "profiling"


def text(name: str) -> str:
    return (DATA / name).read_text()


def found(name: str) -> list[dict]:
    from hppctl.profiling import parse

    return parse.records(text(name))
