"""Pure: the learning-rate schedule (`TrainOptions.learning_rate`), a function of the round alone."""

from __future__ import annotations

import math

import pytest

from hppctl.runtime.config import TrainOptions


def test_constant_is_the_rate_of_every_round():
    opts = TrainOptions(lr=0.3, rounds=10)
    assert [opts.learning_rate(r) for r in range(10)] == [0.3] * 10


def test_warmup_rises_linearly_then_holds():
    opts = TrainOptions(lr=0.4, rounds=10, warmup_rounds=4)
    assert [opts.learning_rate(r) for r in range(6)] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4])


def test_cosine_decays_from_the_peak_towards_zero_without_reaching_it():
    opts = TrainOptions(lr=1.0, rounds=8, lr_schedule="cosine")
    rates = [opts.learning_rate(r) for r in range(8)]
    assert rates[0] == 1.0
    assert rates[4] == pytest.approx(0.5)
    assert all(a > b for a, b in zip(rates, rates[1:]))
    assert rates[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 7 / 8))) and rates[-1] > 0


def test_cosine_starts_after_the_warmup():
    opts = TrainOptions(lr=1.0, rounds=12, lr_schedule="cosine", warmup_rounds=4)
    assert [opts.learning_rate(r) for r in range(5)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])
    assert opts.learning_rate(8) == pytest.approx(0.5)


def test_a_resumed_run_gets_the_rates_of_the_uninterrupted_one():
    whole = TrainOptions(lr=0.1, rounds=20, lr_schedule="cosine", warmup_rounds=2)
    resumed = whole.model_copy(update={"start_round": 7})
    assert [resumed.learning_rate(r) for r in range(7, 20)] == [whole.learning_rate(r) for r in range(7, 20)]
