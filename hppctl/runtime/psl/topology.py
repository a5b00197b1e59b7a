"""PURE: who is who in a PSL run, and the order each helper serves its tasks in.

Ranks: the plan's clients first (in plan order), then its helpers. Every worker derives the same
`PslTopology` from the same plan, so no rank map is exchanged.

Task order. A plan's per-helper `sequence` may split a task into pieces (admm and exact plans are
preemptive on a slot grid). The runtime does not preempt: a part-2 forward or backward runs whole,
at the position of the task's **last** piece, i.e. tasks run in the order the plan completes them.
For FCFS plans (balanced-greedy, random-fcfs) every task is one piece and the order is the plan's
sequence exactly. B tasks keep the plan's order, which for admm/exact is the largest-tail-first
rule of the exact backward schedule (docs/psl.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from hppctl.models.psl import PslPiece, PslPlan

Task = tuple[str, str]
"""(kind "F" | "B", client)."""


def task_order(sequence: list[PslPiece]) -> list[Task]:
    """Tasks in the order their last piece appears (each task once)."""
    last = {(p.kind, p.client): k for k, p in enumerate(sequence)}
    return sorted(last, key=last.__getitem__)


def task_tails(plan: PslPlan, helper: str) -> dict[Task, float]:
    """Client work left after each task of `helper` (planned seconds): F: l + l′ + p′ + r′, B: r′.
    The `ltf` order serves the ready task with the largest tail first (Theorem 2's rule, applied
    online and without preemption; `schedule.psl_sim`'s `ltf` policy is its preemptive twin)."""
    t, i = plan.times, plan.helpers.index(helper)
    tails: dict[Task, float] = {}
    for j, (client, assigned) in enumerate(zip(plan.clients, plan.assignment)):
        if assigned == helper:
            tails[("B", client)] = t.r_prime_s[i][j]
            tails[("F", client)] = t.l_s[i][j] + t.l_prime_s[i][j] + t.p_prime_s[i][j] + t.r_prime_s[i][j]
    return tails


def is_preemptive(plan: PslPlan) -> bool:
    return any(len(task_order(h.sequence)) != len(h.sequence) for h in plan.helper_plans)


def collapsed_plan(plan: PslPlan) -> PslPlan:
    """The plan as the runtime executes it: one whole piece per task, in `task_order`. Only for
    replaying in the simulator (`simulate_psl(collapsed_plan(p))`): the pieces' times are not re-planned."""
    helper_plans = []
    for h in plan.helper_plans:
        pieces = [PslPiece(kind=kind, client=client, fraction=1.0, start_s=0.0, end_s=0.0)
                  for kind, client in task_order(h.sequence)]
        helper_plans.append(h.model_copy(update={"sequence": pieces}))
    return plan.model_copy(update={"helper_plans": helper_plans})


@dataclass(frozen=True)
class PslTopology:
    clients: tuple[str, ...]
    helpers: tuple[str, ...]
    helper_of: dict[str, str]
    """The helper serving each client (the plan's assignment)."""
    cuts: dict[str, tuple[int, int]]
    """(σ1, σ2) of each client: parts [0, σ1), [σ1, σ2), [σ2, L)."""
    orders: dict[str, tuple[Task, ...]]
    """Each helper's tasks in serving order."""

    @classmethod
    def of(cls, plan: PslPlan) -> "PslTopology":
        return cls(tuple(plan.clients), tuple(plan.helpers), dict(zip(plan.clients, plan.assignment)),
                   {c: (cut[0], cut[1]) for c, cut in zip(plan.clients, plan.cuts)},
                   {h.helper: tuple(task_order(h.sequence)) for h in plan.helper_plans})

    @property
    def devices(self) -> tuple[str, ...]:
        """Every device in rank order."""
        return self.clients + self.helpers

    @property
    def world_size(self) -> int:
        return len(self.clients) + len(self.helpers)

    def rank(self, device: str) -> int:
        return self.devices.index(device)

    def clients_of(self, helper: str) -> list[str]:
        return [c for c in self.clients if self.helper_of[c] == helper]

    def part_ranges(self, num_layers: int) -> list[tuple[int, int]]:
        """Every distinct layer range a device holds (parts 1, 2 and 3 of every client), for the
        launcher to cut once and ship by range."""
        seen: dict[tuple[int, int], None] = {}
        for s1, s2 in self.cuts.values():
            for r in ((0, s1), (s1, s2), (s2, num_layers)):
                seen[r] = None
        return list(seen)
