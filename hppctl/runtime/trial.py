"""A plan trained for a few rounds on the cluster, for its throughput only (`hppctl plan --trial`).

The profile is a model of the devices; what a plan delivers depends on more than it holds (a CPU
quota's budget lets an idle device run faster than its sustained speed, a link's CPU cost, the
layer pass's view of a fused stage). So `--trial` trains the simulator's best few candidates on the
real workers, each from the seed's weights on synthetic samples of the model's input (the samples'
values do not change the time), and keeps the fastest measured: the figure `hppctl run` reports, the
median samples/s of its rounds after `warmup` (the first rounds start workers and fill caches).
"""

from __future__ import annotations

import statistics
from typing import Callable

from hppctl.models.cluster import ClusterSpec
from hppctl.models.plan import HppPlan
from hppctl.planner.micro_batch import TRIAL_WARMUP, Tried, trial_candidates, with_choice
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.launch import default_threads
from hppctl.runtime.session import RunRequest, Session

TRIAL_DATASET = "synthetic"


def measure_plan(plan: HppPlan, cluster: ClusterSpec, *, rounds: int, warmup: int, timeout_s: float = 300.0) -> float:
    """Train `plan` for `rounds` rounds (> `warmup`): the median samples/s of the rounds after the
    warm-up; raises what `hppctl run` would."""
    if rounds <= warmup:
        raise ValueError(f"a trial of {rounds} rounds has none after its {warmup} warm-up rounds")
    options = TrainOptions(dataset=TRIAL_DATASET, seed=0, rounds=rounds, threads=default_threads(cluster, plan.devices()),
                           timeout_s=timeout_s, divergence_factor=0.0)  # a few rounds for time: no loss check
    rows: list[dict] = []
    Session(RunRequest(plan, cluster, options)).run(on_round=rows.append)
    return statistics.median(r["samples_per_s"] for r in rows[warmup:])


def trial_order(candidates: list, passes: int) -> list[tuple[int, int, object]]:
    """(pass, index, candidate) in the order the trial trains them: forwards in odd passes, backwards
    in even ones (A B C, C B A, …), so a machine that speeds up or slows down over the trial shifts
    every candidate's mean of its passes alike instead of favouring whichever ran first."""
    order = []
    for p in range(1, passes + 1):
        indexed = list(enumerate(candidates, 1))
        order += [(p, i, c) for i, c in (indexed if p % 2 else reversed(indexed))]
    return order


def choose_by_trial(tried: list[Tried], cluster: ClusterSpec, *, top: int, rounds: int, passes: int = 1,
                    finish: Callable[[HppPlan], HppPlan] = lambda plan: plan, timeout_s: float = 300.0,
                    announce: Callable[[str], None] = lambda line: None, where: str = "") -> HppPlan | None:
    """`--micro-batch auto`'s candidates (`try_micro_batches`, ranked by the simulator): the best `top`,
    each made runnable by `finish` (its split form under --split-backward) and trained `rounds` rounds on
    `cluster`, `passes` times in `trial_order`; the plan of the fastest measured (its passes' mean), its
    record ranked by the measurements (None: no candidate can be chosen). `announce` gets a line before
    and after each trial (`where`: the cluster's name in it)."""
    short = trial_candidates(tried, top)
    runnable = {t.micro_batch: finish(t.plan) for t in short}  # once per candidate, not once per pass
    figures: dict[int, list[float]] = {t.micro_batch: [] for t in short}
    for p, i, candidate in trial_order(short, passes):
        label = f"trial {i}/{len(short)}{f' (pass {p}/{passes})' if passes > 1 else ''}: micro-batch {candidate.micro_batch}"
        announce(f"{label} ({candidate.score:.1f} samples/s simulated), {rounds} rounds{f' on {where}' if where else ''} …")
        figure = measure_plan(runnable[candidate.micro_batch], cluster, rounds=rounds, warmup=TRIAL_WARMUP, timeout_s=timeout_s)
        figures[candidate.micro_batch].append(figure)
        announce(f"{label} measured {figure:.1f} samples/s (median of rounds {TRIAL_WARMUP + 1}-{rounds})")
    measured = {b: statistics.fmean(v) for b, v in figures.items()}
    return with_choice(tried, measured) if short else None
