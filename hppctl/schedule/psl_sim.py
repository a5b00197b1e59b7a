"""PURE: event-driven replay of a parallel split learning plan — the batch makespan in seconds.

A client's batch is the chain r → F (on its helper) → l → l′ → B (on its helper) → r′; only the
helper is shared, so every helper is simulated on its own. Policies:

- `plan`: the helper serves the plan's pieces in order; a piece starts when the helper is free
  and its input is there (F: at r; B: when the client's gradients arrive, F finish + l + l′) and
  takes its `fraction` of the task's time. This is how a runtime follows a plan; with the true
  (unrounded) times a slot plan finishes no later than its slot prediction.
- `fcfs`: what-if, same assignment — one mixed queue, earliest arrival first, non-preemptive.
- `ltf`: what-if, same assignment — preemptive, the available task with the most client work
  left after it first (F: l + l′ + p′ + r′; B: r′), i.e. the optimal backward rule (Theorem 2)
  applied online to both directions.

`slowdown` multiplies a helper's p and p′ (a straggler what-if).

    result = simulate_psl(plan)                       # PslSimResult: makespan_s, clients, helpers
    trace = psl_trace(simulate_psl(plan, trace=True)) # Chrome trace events (Perfetto)
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from hppctl.models.psl import PslPlan

Policy = Literal["plan", "fcfs", "ltf"]
POLICIES = ("plan", "fcfs", "ltf")


@dataclass(frozen=True)
class ClientResult:
    client: str
    helper: str
    forward_done_s: float
    backward_done_s: float
    completion_s: float
    queueing_s: float
    """Completion minus the client's six times on its helper (waiting at the helper)."""


@dataclass(frozen=True)
class HelperResult:
    helper: str
    clients: int
    busy_s: float
    finish_s: float
    pieces: int
    """Task pieces run (more than 2 x clients means preemptions)."""


@dataclass
class PslSimResult:
    policy: str
    makespan_s: float
    clients: list[ClientResult]
    helpers: list[HelperResult]
    segments: list[tuple[str, str, str, float, float]] = field(default_factory=list)
    """(device, label, category, start, end) when traced: helper pieces and client steps."""

    @property
    def critical_client(self) -> ClientResult:
        return max(self.clients, key=lambda c: c.completion_s)


@dataclass(frozen=True)
class _Times:
    r: np.ndarray
    p: np.ndarray
    l: np.ndarray  # noqa: E741
    lp: np.ndarray
    pp: np.ndarray
    rp: np.ndarray


def simulate_psl(plan: PslPlan, *, policy: Policy = "plan", slowdown: dict[str, float] | None = None,
                 trace: bool = False) -> PslSimResult:
    """Replay `plan` (its own times) under `policy`; see the module docstring."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (use one of: {', '.join(POLICIES)})")
    times = _times(plan, slowdown or {})
    col = {c: j for j, c in enumerate(plan.clients)}
    clients: dict[int, ClientResult] = {}
    helpers, segments = [], []
    for i, hp in enumerate(plan.helper_plans):
        mine = [col[c] for c in hp.clients]
        run = {"plan": _replay, "fcfs": _fcfs, "ltf": _ltf}[policy]
        pieces, f_done, b_done = run(plan, times, i, mine) if policy == "plan" else run(times, i, mine)
        for j in mine:
            c = b_done[j] + times.rp[i, j]
            path = times.r[i, j] + times.p[i, j] + times.l[i, j] + times.lp[i, j] + times.pp[i, j] + times.rp[i, j]
            clients[j] = ClientResult(plan.clients[j], hp.helper, float(f_done[j]), float(b_done[j]), float(c),
                                      max(0.0, float(c - path)))
        busy = sum(end - start for _, _, start, end in pieces)
        helpers.append(HelperResult(hp.helper, len(mine), float(busy), float(max((e for *_, e in pieces), default=0.0)),
                                    len(pieces)))
        if trace:
            segments += _segments(plan, times, i, pieces, f_done, b_done)
    ordered = [clients[j] for j in range(len(plan.clients))]
    return PslSimResult(policy, max(c.completion_s for c in ordered), ordered, helpers, segments)


def _times(plan: PslPlan, slowdown: dict[str, float]) -> _Times:
    t = plan.times
    factor = np.array([slowdown.get(h, 1.0) for h in plan.helpers])[:, None]
    return _Times(np.asarray(t.r_s), np.asarray(t.p_s) * factor, np.asarray(t.l_s), np.asarray(t.l_prime_s),
                  np.asarray(t.p_prime_s) * factor, np.asarray(t.r_prime_s))


Piece = tuple[str, int, float, float]  # (kind, client, start, end)


def _replay(plan: PslPlan, t: _Times, i: int, mine: list[int]) -> tuple[list[Piece], dict, dict]:
    col = {c: j for j, c in enumerate(plan.clients)}
    now, pieces = 0.0, []
    f_left = {j: 1.0 for j in mine}
    f_done: dict[int, float] = {}
    b_done: dict[int, float] = {}
    for piece in plan.helper_plans[i].sequence:
        j = col[piece.client]
        if piece.kind == "F":
            ready, work = t.r[i, j], t.p[i, j]
        else:
            ready, work = f_done[j] + t.l[i, j] + t.lp[i, j], t.pp[i, j]
        start = max(now, ready)
        now = start + piece.fraction * work
        pieces.append((piece.kind, j, start, now))
        if piece.kind == "F":
            f_left[j] -= piece.fraction
            if f_left[j] <= 1e-9:
                f_done[j] = now
        else:
            b_done[j] = now
    return pieces, f_done, b_done


def _fcfs(t: _Times, i: int, mine: list[int]) -> tuple[list[Piece], dict, dict]:
    queue = [(t.r[i, j], j, 0) for j in mine]
    heapq.heapify(queue)
    now, pieces, f_done, b_done = 0.0, [], {}, {}
    while queue:
        arrival, j, kind = heapq.heappop(queue)
        start = max(now, arrival)
        now = start + (t.p[i, j] if kind == 0 else t.pp[i, j])
        pieces.append(("F" if kind == 0 else "B", j, start, now))
        if kind == 0:
            f_done[j] = now
            heapq.heappush(queue, (now + t.l[i, j] + t.lp[i, j], j, 1))
        else:
            b_done[j] = now
    return pieces, f_done, b_done


def _ltf(t: _Times, i: int, mine: list[int]) -> tuple[list[Piece], dict, dict]:
    """Preemptive: at every arrival or completion run the available task with the largest tail."""
    left = {("F", j): t.p[i, j] for j in mine} | {("B", j): t.pp[i, j] for j in mine}
    tail = {("F", j): t.l[i, j] + t.lp[i, j] + t.pp[i, j] + t.rp[i, j] for j in mine} | \
           {("B", j): t.rp[i, j] for j in mine}
    arrivals = [(t.r[i, j], "F", j) for j in mine]
    heapq.heapify(arrivals)
    ready: list[tuple[float, str, int]] = []
    now, pieces, f_done, b_done = 0.0, [], {}, {}
    while arrivals or ready:
        while arrivals and arrivals[0][0] <= now + 1e-12:
            _, kind, j = heapq.heappop(arrivals)
            heapq.heappush(ready, (-tail[(kind, j)], kind, j))
        if not ready:
            now = arrivals[0][0]
            continue
        _, kind, j = ready[0]
        until = min(now + left[(kind, j)], arrivals[0][0] if arrivals else np.inf)
        if pieces and pieces[-1][:2] == (kind, j) and pieces[-1][3] == now:
            pieces[-1] = (kind, j, pieces[-1][2], until)  # not preempted: extend the running piece
        else:
            pieces.append((kind, j, now, until))
        left[(kind, j)] -= until - now
        now = until
        if left[(kind, j)] <= 1e-12:
            heapq.heappop(ready)
            if kind == "F":
                f_done[j] = now
                heapq.heappush(arrivals, (now + t.l[i, j] + t.lp[i, j], "B", j))
            else:
                b_done[j] = now
    return pieces, f_done, b_done


def _segments(plan: PslPlan, t: _Times, i: int, pieces: list[Piece], f_done: dict, b_done: dict) -> list:
    helper = plan.helpers[i]
    out = [(helper, f"{kind}:{plan.clients[j]}", "helper-" + kind, s, e) for kind, j, s, e in pieces]
    for j in f_done:
        c = plan.clients[j]
        out += [(c, "part-1 fwd + upload (r)", "client", 0.0, t.r[i, j]),
                (c, "download + part-3 fwd (l) + bwd (l')", "client", f_done[j], f_done[j] + t.l[i, j] + t.lp[i, j]),
                (c, "download + part-1 bwd (r')", "client", b_done[j], b_done[j] + t.rp[i, j])]
    return out


def psl_trace(result: PslSimResult, title: str = "psl") -> dict:
    """Chrome trace events (ui.perfetto.dev): one row per helper and per client, microseconds."""
    return segments_trace(result.segments, title)


def segments_trace(segments: list[tuple[str, str, str, float, float]], title: str) -> dict:
    """Chrome trace events of (device, label, category, start s, end s) segments: one row per device,
    in the order they first appear; the replay's (`psl_trace`) and a real run's (runtime/psl/session.py)."""
    rows = {d: k for k, d in enumerate(dict.fromkeys(d for d, *_ in segments))}
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": title}}]
    events += [{"ph": "M", "name": "thread_name", "pid": 0, "tid": k, "args": {"name": d}} for d, k in rows.items()]
    events += [{"ph": "X", "name": label, "cat": cat, "pid": 0, "tid": rows[d], "ts": s * 1e6, "dur": (e - s) * 1e6}
               for d, label, cat, s, e in segments]
    return {"traceEvents": events, "displayTimeUnit": "ms"}
