"""Divergence detection: the launcher's check of every round's loss (issue 25, item 3).

A run stops with `Diverged` (exit 4) when a round's loss is

- not finite (NaN or infinity), or
- more than `factor` times the baseline: the mean loss of the run's first `BASELINE_ROUNDS` rounds,
  or of as many as it has run so far (from its second round on, an explosion is caught at once). A
  resumed run's baseline is its own first rounds.

`factor` is `TrainOptions.divergence_factor` (`hppctl run --divergence-factor`, default
`DEFAULT_FACTOR`); 0 turns the check off, non-finite losses included. The launcher checks a round
before it writes the checkpoint that holds the weights that round's loss was computed with, so
the newest complete checkpoint round of a diverged run is one whose loss passed (runtime/session.py).
"""

from __future__ import annotations

import math

from hppctl.errors import Diverged

DEFAULT_FACTOR = 10.0
BASELINE_ROUNDS = 3


class DivergenceGuard:
    """Checks rounds in order; `check` raises `Diverged` naming the round, its loss and the rule."""

    def __init__(self, factor: float, baseline_rounds: int = BASELINE_ROUNDS) -> None:
        self.factor = factor
        self.baseline_rounds = baseline_rounds
        self._first: list[float] = []

    @property
    def enabled(self) -> bool:
        return self.factor > 0

    def baseline(self) -> float | None:
        """Mean loss of the run's first rounds: the first `baseline_rounds`, or as many as seen so far."""
        return sum(self._first) / len(self._first) if self._first else None

    def check(self, round_index: int, loss: float | None) -> None:
        if not self.enabled or loss is None:
            return
        if not math.isfinite(loss):
            raise Diverged(f"training diverged: round {round_index} loss is {loss} {_advice()}")
        base = self.baseline()
        if base is not None and base > 0 and loss > self.factor * base:
            raise Diverged(f"training diverged: round {round_index} loss {loss:.4g} is more than "
                           f"{self.factor:g}x the first rounds' mean {base:.4g} {_advice()}")
        if len(self._first) < self.baseline_rounds:
            self._first.append(loss)


def check_final_states(states: dict[str, dict], last_round: int) -> None:
    """`Diverged` if a final state holds NaN or infinity (the last round's update can break weights
    its loss never saw). `states`: owner (as the message names it, e.g. "stage 0's") -> its state
    (`{"model": …, "optimizer": …}`, `first_nonfinite_tensor`'s input)."""
    for owner, state in states.items():
        name = first_nonfinite_tensor(state)
        if name is not None:
            raise Diverged(f"training diverged: after round {last_round}, {owner} {name} holds NaN or infinity "
                           f"{_advice()}")


def _advice() -> str:
    return "(lower --lr; --divergence-factor 0 turns this check off)"


def first_nonfinite_tensor(state: dict) -> str | None:
    """The name of the first floating-point tensor of a stage state (`{"model": …, "optimizer": …}`)
    holding NaN or infinity, or None: such a state is never written as a complete checkpoint."""
    import torch

    named = list(state.get("model", {}).items())
    for index, values in state.get("optimizer", {}).get("state", {}).items():
        named += [(f"optimizer.state.{index}.{key}", v) for key, v in values.items()]
    for name, tensor in named:
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return name
    return None
