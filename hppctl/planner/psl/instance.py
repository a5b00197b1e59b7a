"""The PSL instance as numbers, and a solved timeline. Pure numpy; the unit is seconds or slots.

`Instance` holds the paper's six per-pair times as `[helper, client]` arrays plus memory;
`quantize(slot_s)` turns seconds into whole slots (rounded up, as the paper does), which is
what the time-indexed methods (admm, exact) solve. `Timeline` is any method's answer: per
helper, the pieces it runs in order, and every client's finish times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hppctl.models.psl import PslTimes

F, B = "F", "B"


@dataclass(frozen=True)
class Instance:
    """Six `[helper, client]` time arrays in one unit, client demands and helper capacities in bytes."""

    r: np.ndarray
    p: np.ndarray
    l: np.ndarray  # noqa: E741  (the paper's name)
    lp: np.ndarray
    """l′: part-3 backward + gradient upload."""
    pp: np.ndarray
    """p′: helper part-2 backward."""
    rp: np.ndarray
    """r′: gradient download + part-1 backward (the client's tail after the helper)."""
    demand: np.ndarray
    capacity: np.ndarray

    @property
    def num_helpers(self) -> int:
        return self.r.shape[0]

    @property
    def num_clients(self) -> int:
        return self.r.shape[1]

    @classmethod
    def from_times(cls, times: PslTimes) -> "Instance":
        arrays = [np.asarray(getattr(times, f), dtype=float)
                  for f in ("r_s", "p_s", "l_s", "l_prime_s", "p_prime_s", "r_prime_s")]
        return cls(*arrays, demand=np.asarray(times.demand_bytes, dtype=np.int64),
                   capacity=np.asarray(times.capacity_bytes, dtype=np.int64))

    def quantize(self, slot_s: float) -> "Instance":
        """Whole slots, rounded up (a task of 2.01 slots takes 3); helper tasks take at least one slot."""
        def up(a: np.ndarray, least: int = 0) -> np.ndarray:
            return np.maximum(np.ceil(a / slot_s - 1e-9), least).astype(np.int64)
        return Instance(up(self.r), up(self.p, 1), up(self.l), up(self.lp), up(self.pp, 1), up(self.rp),
                        self.demand, self.capacity)

    def path(self) -> np.ndarray:
        """r + p + l + l′ + p′ + r′ per pair: a client's batch time with no queueing."""
        return self.r + self.p + self.l + self.lp + self.pp + self.rp

    def lower_bound(self) -> float:
        """No plan beats the slowest client's best path, nor the helpers' least total work spread evenly."""
        per_client = float(self.path().min(axis=0).max())
        work = float((self.p + self.pp).min(axis=0).sum()) / self.num_helpers
        return max(per_client, work)

    def horizon(self) -> float:
        """The paper's T: worst transmission/local time + every client's worst helper work back to back."""
        return float((self.r + self.l + self.rp + self.lp).max() + (self.p + self.pp).max(axis=0).sum())

    def forward_horizon(self) -> float:
        """The paper's T_f: worst r + l + every client's worst forward task back to back."""
        return float((self.r + self.l).max() + self.p.max(axis=0).sum())


def auto_slot(instance: Instance, target_slots: int) -> float:
    """A slot length that makes the forward horizon T_f about `target_slots` slots long.

    The time-indexed models have one binary per (helper, client, slot), so T_f sets their size;
    the paper's Table II instances have T between 176 and 445.
    """
    return instance.forward_horizon() / max(1, target_slots)


@dataclass(frozen=True)
class Piece:
    kind: str
    client: int
    fraction: float
    start: float
    end: float


@dataclass
class Timeline:
    """A method's schedule: per helper the pieces it runs, in order; finish times per client."""

    assignment: np.ndarray
    """Helper index of every client."""
    pieces: list[list[Piece]]
    forward_done: np.ndarray
    """φ^f_j: the helper finishes j's F task."""
    backward_done: np.ndarray
    """φ_j: the helper finishes j's B task."""
    completion: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.completion = np.zeros(len(self.assignment))

    def finish(self, instance: Instance) -> "Timeline":
        """c_j = φ_j + r′ of the client's helper (Eq. 9)."""
        cols = np.arange(len(self.assignment))
        self.completion = self.backward_done + instance.rp[self.assignment, cols]
        return self

    @property
    def makespan(self) -> float:
        return float(self.completion.max()) if len(self.completion) else 0.0


def slot_pieces(owner: np.ndarray, work: dict[tuple[str, int], int]) -> list[Piece]:
    """Run-length pieces of one helper's slot timeline (`owner[t]` = (kind, client) code or -1)."""
    pieces: list[Piece] = []
    t, horizon = 0, len(owner)
    while t < horizon:
        code = int(owner[t])
        if code < 0:
            t += 1
            continue
        end = t
        while end < horizon and owner[end] == code:
            end += 1
        kind, j = (F if code % 2 == 0 else B), code // 2
        pieces.append(Piece(kind, j, (end - t) / work[(kind, j)], float(t), float(end)))
        t = end
    return pieces


def check_slot_timeline(q: Instance, timeline: Timeline) -> None:
    """Raise `ValueError` unless `timeline` obeys P on the slot instance `q`: one task per helper slot,
    release (1), precedence (2), all work done (6, 7) and c_j = φ_j + r′ (9)."""
    for i, pieces in enumerate(timeline.pieces):
        taken: set[int] = set()
        slots: dict[tuple[str, int], list[int]] = {}
        for pc in pieces:
            span = set(range(int(pc.start), int(pc.end)))
            if span & taken:
                raise ValueError(f"helper {i}: two tasks in slot {min(span & taken)}")
            taken |= span
            slots.setdefault((pc.kind, pc.client), []).extend(sorted(span))
        for j in np.flatnonzero(timeline.assignment == i):
            f, b = sorted(slots.get((F, j), [])), sorted(slots.get((B, j), []))
            if len(f) != q.p[i, j] or len(b) != q.pp[i, j]:
                raise ValueError(f"helper {i}, client {j}: {len(f)}/{q.p[i, j]} F and {len(b)}/{q.pp[i, j]} B slots")
            if f[0] < q.r[i, j] or b[0] < f[-1] + 1 + q.l[i, j] + q.lp[i, j]:
                raise ValueError(f"helper {i}, client {j}: F before its release or B before its gradients arrive")
            if timeline.completion[j] != b[-1] + 1 + q.rp[i, j]:
                raise ValueError(f"client {j}: completion {timeline.completion[j]} is not φ + r′")


def task_code(kind: str, client: int) -> int:
    return 2 * client + (0 if kind == F else 1)


def ceil_slots(seconds: float, slot_s: float) -> int:
    return max(0, math.ceil(seconds / slot_s - 1e-9))
