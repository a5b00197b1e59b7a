"""`hppctl psl plan|simulate|run`: parallel split learning — many data-owning clients, a few helpers.

`plan` and `simulate` are pure; `run` trains a plan on real worker processes (hppctl/runtime/psl/).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from hppctl.cli.flags import MIN_PERIOD_S, check_optimizer_flags, divergence_factor as check_divergence_factor, positive, seconds, seed as check_seed, threads as check_threads
from hppctl.cli.flags import WORKDIR_HELP, check_checkpoint_flags, check_extension_flags
from hppctl.cli.output import LOG_EVERY_HELP, emit_json, note, progress_log, stdout, writable_path
from hppctl.cli.view import PslView
from hppctl import driver
from hppctl.errors import BadInput
from hppctl.runtime.bootstrap import check_listen
from hppctl.models.psl import METHODS, PslPlan, PslRequest, PslSpec
from hppctl.models.units import format_bytes, parse_duration
from hppctl.store import load, save, write_text_atomic

MAX_TARGET_SLOTS = 100_000
"""The time-indexed solvers grow with the slot count: 10^7 slots took 4 s on 3 devices, 10^9 ran past 60 s."""

EXAMPLES = """
Examples (from the repository root; the spec format is in docs/psl.md, outputs under out/):

\b
  hppctl psl plan --spec examples/psl.yaml --out out/psl.yaml
  hppctl psl plan --spec examples/psl.yaml --method exact --slot 1ms --time-limit 120
  hppctl psl plan --spec examples/psl.yaml --compare                   # every method side by side
  hppctl psl plan --profile profiles/example-tiny.json --clients pi0,nano0 --helpers tx0 --cut 3,8 --batch 16
  hppctl psl simulate --plan out/psl.yaml --trace out/psl-trace.json   # open in ui.perfetto.dev
  hppctl psl simulate --plan out/psl.yaml --policy ltf --slow nx=2 --json
  hppctl psl run --plan out/psl.yaml --cluster examples/psl-cluster.yaml --rounds 20 --dataset digits --metrics out/m.jsonl
  hppctl psl run --plan out/psl.yaml --cluster examples/psl-cluster.yaml --local-batches 4 --shares 3,1,1 --json
  hppctl psl run --plan out/psl.yaml --cluster examples/psl-cluster.yaml --order ltf   # online largest-tail-first
  hppctl psl run --plan out/psl.yaml --cluster examples/psl-cluster.yaml --dataset digits --checkpoint-dir out/psl-ck --resume --more-rounds 5   # cron: 5 rounds more each start
"""

AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def plan_command(
    spec_file: Annotated[Optional[Path], typer.Option("--spec", help="PSL spec (.yaml/.json): model, cut, clients, helpers (docs/psl.md).")] = None,
    profile_file: Annotated[Optional[Path], typer.Option("--profile", help="Instead of --spec: a profile from `hppctl profile` holding the clients and helpers.")] = None,
    clients: Annotated[Optional[str], typer.Option("--clients", help="With --profile: comma-separated client devices.")] = None,
    helpers: Annotated[Optional[str], typer.Option("--helpers", help="With --profile: comma-separated helper devices.")] = None,
    cut: Annotated[Optional[str], typer.Option("--cut", help="With --profile: cut layers σ1,σ2 (parts [0,σ1), [σ1,σ2), [σ2,L)).")] = None,
    batch: Annotated[int, typer.Option("--batch", help="With --profile: samples per batch.")] = 32,
    method: Annotated[str, typer.Option("--method", help=f"{', '.join(METHODS)}.")] = "auto",
    slot: Annotated[Optional[str], typer.Option("--slot", help="Slot length of admm/exact, e.g. 50ms (default: the spec's, else sized to --target-slots).")] = None,
    target_slots: Annotated[int, typer.Option("--target-slots", help="Automatic slot: forward horizon T_f in slots (at most 100000).")] = 100,
    seed: Annotated[int, typer.Option("--seed", help="random-fcfs: seed of the random assignment.")] = 0,
    time_limit: Annotated[float, typer.Option("--time-limit", help="Seconds each solver (HiGHS) may take (0.01 to 2592000).")] = 60.0,
    rho: Annotated[Optional[float], typer.Option("--rho", help="admm: ADMM penalty per slot (default 2; the paper's code used 350; docs/psl.md).")] = None,
    compare: Annotated[bool, typer.Option("--compare", help="Run every method on the same instance; nothing is written.")] = False,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the plan here (.json or .yaml).")] = None,
    as_json: AsJson = False,
) -> None:
    """Assign clients to helpers under helper memory and order each helper's tasks; predict the batch makespan."""
    from hppctl.planner.psl import pair_times, plan_times
    from hppctl.schedule.psl_sim import simulate_psl

    writable_path("--out", out)  # before reading the spec and solving
    profile, request, spec_slot = _problem(spec_file, profile_file, clients, helpers, cut, batch)
    positive("--target-slots", target_slots, high=MAX_TARGET_SLOTS)
    seconds("--time-limit", time_limit, low=0.01)
    check_seed("--seed", seed)
    positive("--rho", rho)
    slot_s = _parse_slot(slot) if slot is not None else spec_slot
    times = pair_times(profile, request)
    options = dict(model=profile.model, granularity=profile.granularity, slot_s=slot_s, target_slots=target_slots,
                   seed=seed, time_limit_s=time_limit, **({} if rho is None else {"rho": rho}))
    if compare:
        rows = driver.compare_psl_methods(times, request, options, simulate_psl)
        emit_json(rows) if as_json else _render_compare(rows)
        return
    plan = plan_times(times, request, method, **options)
    if out is not None:
        save(out, plan)
        note(f"wrote {out}")
    simulated = simulate_psl(plan).makespan_s
    if as_json:
        emit_json({"plan": plan.model_dump(mode="json"), "simulated_makespan_s": simulated})
        return
    _render_plan(plan, simulated)


def _problem(spec_file, profile_file, clients, helpers, cut, batch):
    """(profile, request, slot from the spec) from --spec, or from --profile + --clients/--helpers/--cut."""
    if (spec_file is None) == (profile_file is None):
        raise BadInput("give exactly one of --spec FILE or --profile FILE (with --clients, --helpers, --cut)")
    if spec_file is not None:
        if any(v is not None for v in (clients, helpers, cut)):
            raise BadInput("--clients, --helpers and --cut go with --profile; a --spec file lists its own")
        spec = load(spec_file, PslSpec)
        return driver.spec_profile(spec, str(spec_file)), spec.request(), None if spec.slot == "auto" else spec.slot
    from hppctl.models.profile import Profile
    from pydantic import ValidationError

    profile = load(profile_file, Profile)
    for flag, value in (("--clients", clients), ("--helpers", helpers), ("--cut", cut)):
        if not value:
            raise BadInput(f"{flag}: required with --profile")
    names = [n.strip() for n in clients.split(",") if n.strip()]
    try:
        cuts = [int(v) for v in cut.split(",")]
        if len(cuts) != 2:
            raise ValueError
    except ValueError:
        raise BadInput(f"--cut: expected two layer indices like 3,15, got {cut!r}") from None
    try:
        request = PslRequest(clients=names, helpers=[n.strip() for n in helpers.split(",") if n.strip()],
                             cuts=[cuts] * len(names), batch=batch)
    except ValidationError as e:
        from hppctl.store import describe_validation_error
        raise BadInput(describe_validation_error("--clients/--helpers/--cut/--batch", e)) from None
    return profile, request, None


def _parse_slot(text: str) -> float:
    try:
        value = parse_duration(text)
    except ValueError as e:
        raise BadInput(f"--slot: {e}") from None
    if value <= 0:  # parse_duration refuses non-finite and negative values, not 0
        raise BadInput(f"--slot: must be a positive finite duration (got {text!r})")
    return value


def _render_plan(plan: PslPlan, simulated: float) -> None:
    pred = plan.prediction
    chosen = plan.method if plan.method == plan.requested_method else f"{plan.method} (chosen by {plan.requested_method})"
    stdout.print(f"psl plan for {plan.model} ({plan.granularity}), batch {plan.batch}: {len(plan.clients)} clients, "
                 f"{len(plan.helpers)} helpers, method {chosen}")
    table = Table(box=None, pad_edge=False)
    for col in ("helper", "clients", "memory of budget", "task order (first 12; F forward, B backward, of a client)"):
        table.add_column(col)
    for h in plan.helper_plans:
        order = " ".join(str(p) for p in h.sequence[:12]) + (" …" if len(h.sequence) > 12 else "")
        table.add_row(h.helper, str(len(h.clients)), f"{format_bytes(h.memory_bytes)} of {format_bytes(h.memory_budget_bytes)}",
                      order)
    stdout.print(table)
    slots = f" ({pred.makespan_slots} slots of {plan.slot_s * 1e3:.1f} ms)" if plan.slot_s else ""
    worst = max(pred.clients, key=lambda c: c.completion_s)
    stdout.print(f"predicted batch makespan (until the last client is done) {pred.makespan_s:.3f} s{slots}; "
                 f"simulated (plan order, unrounded times) "
                 f"{simulated:.3f} s; lower bound {pred.lower_bound_s:.3f} s; last client {worst.client} on "
                 f"{worst.helper} (queued {worst.queueing_s:.3f} s); solver {plan.solver_time_s:.2f} s")
    for n in plan.notes:
        stdout.print(f"note: {n}")


def _render_compare(rows: list[dict]) -> None:
    table = Table(box=None, pad_edge=False, title="methods on the same instance (simulated = plan replayed with unrounded times)")
    for col in ("method", "simulated makespan s", "predicted s", "slots", "vs random+FCFS", "solver s"):
        table.add_column(col)
    for r in rows:
        if not r["feasible"]:
            table.add_row(r["method"], "infeasible", "-", "-", "-", "-")
            continue
        name = r["method"] if r["chosen"] == r["method"] else f"{r['method']} ({r['chosen']})"
        table.add_row(name, f"{r['simulated_makespan_s']:.3f}", f"{r['predicted_makespan_s']:.3f}",
                      str(r["makespan_slots"] or "-"), f"{r.get('vs_random_fcfs', 0):+.1%}", f"{r['solver_time_s']:.2f}")
    stdout.print(table)
    stdout.print("slots: the solver's time grid (admm, exact); vs random+FCFS: against clients given to helpers "
                 "at random and served first come, first served", soft_wrap=True)


def simulate_command(
    plan_file: Annotated[Path, typer.Option("--plan", help="PSL plan (.json/.yaml) from `hppctl psl plan`.")],
    policy: Annotated[str, typer.Option("--policy", help="plan (the plan's order), fcfs or ltf (what-ifs on the same assignment).")] = "plan",
    slow: Annotated[Optional[list[str]], typer.Option("--slow", help="HELPER=FACTOR: multiply a helper's task times (repeatable).")] = None,
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Write Chrome trace events (.json) for Perfetto.")] = None,
    as_json: AsJson = False,
) -> None:
    """Replay a PSL plan event by event: batch makespan, per-client completion and queueing, helper load."""
    from hppctl.schedule.psl_sim import POLICIES, psl_trace, simulate_psl

    writable_path("--trace", trace)  # before reading the plan and simulating
    plan = load(plan_file, PslPlan)
    if policy not in POLICIES:
        raise BadInput(f"--policy: unknown policy {policy!r} (use one of: {', '.join(POLICIES)})")
    slowdown = _parse_slow(slow or [], plan)
    result = simulate_psl(plan, policy=policy, slowdown=slowdown, trace=trace is not None)
    if trace is not None:
        write_text_atomic(trace, json.dumps(psl_trace(result, title=str(plan_file))))
        note(f"wrote {trace} (open in https://ui.perfetto.dev)")
    if as_json:
        emit_json({"policy": policy, "makespan_s": result.makespan_s, "predicted_makespan_s": plan.prediction.makespan_s,
                   "clients": [vars(c) for c in result.clients], "helpers": [vars(h) for h in result.helpers]})
        return
    stdout.print(f"{plan.method} plan, policy {policy}: simulated batch makespan {result.makespan_s:.3f} s "
                 f"(plan's prediction {plan.prediction.makespan_s:.3f} s)")
    table = Table(box=None, pad_edge=False)
    for col in ("helper", "clients", "busy s", "busy", "finish s", "task pieces"):
        table.add_column(col)
    for h in result.helpers:
        table.add_row(h.helper, str(h.clients), f"{h.busy_s:.3f}", f"{h.busy_s / result.makespan_s:.0%}",
                      f"{h.finish_s:.3f}", str(h.pieces))
    stdout.print(table)
    last = result.critical_client
    stdout.print(f"last client {last.client} on {last.helper}: done at {last.completion_s:.3f} s, "
                 f"queued {last.queueing_s:.3f} s")


def _parse_slow(items: list[str], plan: PslPlan) -> dict[str, float]:
    out = {}
    for item in items:
        name, _, factor = item.partition("=")
        if name not in plan.helpers:
            raise BadInput(f"--slow: {name!r} is not a helper of the plan (helpers: {', '.join(plan.helpers)})")
        try:
            value = float(factor)
        except ValueError:
            raise BadInput(f"--slow: expected HELPER=FACTOR like nx0=2, got {item!r}") from None
        positive("--slow", value)  # inf was accepted: a helper that never finishes
        out[name] = value
    return out


def is_psl_file(path: Path) -> bool:
    """True when `path` holds a PSL plan (`kind: psl`): `hppctl run` hands it to `run_psl`."""
    from hppctl.store import read_document

    doc = read_document(path)
    return isinstance(doc, dict) and doc.get("kind") == "psl"


def run_psl(
    plan_file: Annotated[Path, typer.Option("--plan", help="PSL plan (.json/.yaml) from `hppctl psl plan`.")],
    cluster_file: Annotated[Path, typer.Option("--cluster", help="Cluster inventory naming every client and helper (local: or host:).")],
    rounds: Annotated[Optional[int], typer.Option("--rounds", help="Training rounds; each ends with FedAvg. Default 1.")] = None,
    local_batches: Annotated[int, typer.Option("--local-batches", help="Batch updates per client per round.")] = 1,
    shares: Annotated[Optional[str], typer.Option("--shares", help="Relative data shard sizes per client, e.g. 3,1,1 (default: equal).")] = None,
    order: Annotated[str, typer.Option("--order", help="plan: helpers serve the plan's order; ltf: online, the ready task with the most client work after it.")] = "plan",
    dataset: Annotated[str, typer.Option("--dataset", help="synthetic, digits, or package.module:factory.")] = "synthetic",
    workdir: Annotated[Optional[Path], typer.Option("--workdir", help=WORKDIR_HELP)] = None,
    seed: Annotated[int, typer.Option("--seed", help="Initial model, shards and sample orders derive from it (0 to 2^32 - 1).")] = 0,
    optimizer: Annotated[Optional[str], typer.Option("--optimizer", help="sgd (with --momentum) or adam. Default: per model family, printed (docs/runtime.md).")] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", help="Learning rate. Default: the family's (adam), 0.05 for sgd.")] = None,
    momentum: Annotated[Optional[float], typer.Option("--momentum", help="SGD momentum (default 0.9).")] = None,
    weight_decay: Annotated[Optional[float], typer.Option("--weight-decay", help="L2 weight decay (default 0).")] = None,
    checkpoint_dir: Annotated[Optional[Path], typer.Option("--checkpoint-dir", help="Every device's parts and optimizers, written atomically after FedAvg; locked while the run lasts.")] = None,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every", help="Checkpoint every K rounds (and at the end).")] = 1,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the newest complete round in --checkpoint-dir (written by a run of the same plan layout and settings).")] = False,
    more_rounds: Annotated[Optional[int], typer.Option("--more-rounds", help="With --resume: train N rounds past the checkpoint's newest round (from 0 if it has none), so one command continues every day.")] = None,
    init_from: Annotated[Optional[Path], typer.Option("--init-from", help="Start every client and helper from trained weights: a --save-model file or a training plan's checkpoint directory (ignored when --resume finds a round to continue).")] = None,
    metrics: Annotated[Optional[Path], typer.Option("--metrics", help="Per-round metrics (.jsonl): loss, every batch's makespan and tasks; appended to on --resume.")] = None,
    save_model: Annotated[Optional[Path], typer.Option("--save-model", help="Write the FedAvg'd model as one state dict (the model's own names).")] = None,
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Write Chrome trace events (.json) of the batches and FedAvg as run, laid out as `hppctl psl simulate --trace` (ui.perfetto.dev).")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch threads per worker, at most 1024 (default: cores / local workers; SSH workers follow OMP_NUM_THREADS).")] = None,
    listen: Annotated[Optional[str], typer.Option("--listen", help="HOST[:PORT] for the run's store.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for workers to join and for any transfer (1 to 2592000, 30 days).")] = 300.0,
    log: Annotated[Optional[Path], typer.Option("--log", help="Append every worker's output here, prefixed by device.")] = None,
    divergence_factor: Annotated[float, typer.Option("--divergence-factor", help="Stop with exit 4 (diverged) at a NaN or infinite loss, or one above this many times the mean of the first (up to 3) rounds; 0: off.")] = 10.0,
    as_json: AsJson = False,
    log_every: Annotated[Optional[float], typer.Option("--log-every", metavar="SECONDS", help=LOG_EVERY_HELP)] = None,
) -> None:
    """Train a PSL plan: clients (data, parts 1 and 3) and helpers (a part-2 copy per client) as worker processes over gloo; FedAvg every round."""
    from hppctl.models.cluster import ClusterSpec
    from hppctl.runtime.config import TrainOptions
    from hppctl.runtime.psl.config import PslOptions
    from hppctl.runtime.psl.preflight import preflight

    # `hppctl psl run`, and `hppctl run` on a psl plan (which calls this with its own flags).
    # Outputs first, before the plan is read (`hppctl run` on a psl plan checked its own already).
    for flag, path in (("--metrics", metrics), ("--save-model", save_model), ("--log", log), ("--trace", trace)):
        writable_path(flag, path)
    for flag, value in (("--rounds", rounds), ("--local-batches", local_batches), ("--checkpoint-every", checkpoint_every)):
        positive(flag, value)
    _check_checkpoint_flags(checkpoint_dir, checkpoint_every, resume)
    rounds, counted_from = _total_rounds(rounds, more_rounds, checkpoint_dir, resume)
    check_optimizer_flags(optimizer, lr, momentum, weight_decay)
    check_divergence_factor("--divergence-factor", divergence_factor)
    seconds("--timeout", timeout)
    seconds("--log-every", log_every, low=MIN_PERIOD_S)
    check_threads("--threads", threads)
    check_seed("--seed", seed)
    if order not in ("plan", "ltf"):
        raise BadInput(f"--order: unknown value {order!r} (plan or ltf)")
    if metrics is not None and metrics.suffix.lower() not in (".jsonl", ".json"):
        raise BadInput(f"--metrics: {metrics}: use a .jsonl file")
    if trace is not None and trace.suffix.lower() != ".json":
        raise BadInput(f"--trace: {trace}: use a .json file")
    check_listen(listen)
    from hppctl.runtime.workdir import Workdir, open_workdir, user_code
    if not isinstance(workdir, Workdir):  # (`hppctl run` passes the one it opened)
        workdir = open_workdir(workdir)  # first on the import path: the pre-flight imports the dataset from it
    plan = load(plan_file, PslPlan)
    cluster = load(cluster_file, ClusterSpec)
    from hppctl.runtime.accelerator import refuse_cuda
    refuse_cuda(cluster, "psl plans", cluster_source=str(cluster_file))
    if {*plan.clients, *plan.helpers} <= {c.name for c in cluster.devices}:
        from hppctl.runtime.launch import prepare_local_workers
        # the local workers' zygote, before the pre-flight and any torch work (runtime/zygote.py ForkedZygote)
        prepare_local_workers(cluster, [*plan.clients, *plan.helpers], fork_from_here=True)
    share_values = _parse_shares(shares)
    data = preflight(plan, cluster, dataset, share_values, plan_source=str(plan_file), cluster_source=str(cluster_file))
    if threads is None:
        local = [d for d in (*plan.clients, *plan.helpers) if cluster.device(d).local]
        threads = max(1, (os.cpu_count() or 1) // len(local)) if local else 0
    initial = driver.initial_state(init_from, plan.model, checkpoint_dir if resume else None, view=PslView(None))
    from hppctl.runtime.optimizer_defaults import recorded_settings, resolve
    chosen = resolve(plan.model, optimizer=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay,
                     recorded=recorded_settings(checkpoint_dir) if resume else None)
    options = PslOptions(train=TrainOptions(dataset=dataset, seed=seed, rounds=rounds, **chosen.as_options(), threads=threads,
                                            timeout_s=timeout, divergence_factor=divergence_factor),
                         local_batches=local_batches, shares=share_values, order=order)
    lines = progress_log(log_every)
    with lines or contextlib.nullcontext():
        summary = driver.train_psl(plan, cluster, options, data, view=PslView(lines), metrics=metrics,
                                   save_model=save_model, listen=listen, log=log, trace=trace,
                                   user_code=user_code(workdir, dataset=dataset), checkpoint_dir=checkpoint_dir,
                                   checkpoint_every=checkpoint_every, resume=resume, announce=chosen.line(),
                                   initial_state=initial, expected_start=counted_from)
    summary["optimizer"] = {**chosen.as_options(), "source": chosen.source}
    emit_json(summary) if as_json else _render_run(summary)


def _check_checkpoint_flags(checkpoint_dir: Optional[Path], checkpoint_every: int, resume: bool) -> None:
    from hppctl.runtime.checkpoint import check_lock_file

    check_checkpoint_flags(checkpoint_dir, checkpoint_every, resume)
    if checkpoint_dir is not None:
        writable_path("--checkpoint-dir", checkpoint_dir, directory=True)
        check_lock_file(checkpoint_dir / "LOCK")


def _total_rounds(rounds: Optional[int], more_rounds: Optional[int], checkpoint_dir: Optional[Path],
                  resume: bool) -> tuple[int, Optional[int]]:
    """(the run's total rounds, the newest round it counted from or None): --rounds (default 1), or
    --more-rounds past the checkpoint's newest round (counted before the lock: the session checks it)."""
    from hppctl.runtime.checkpoint import CheckpointDir

    check_extension_flags(rounds=rounds, more_rounds=more_rounds, resume=resume)
    if more_rounds is None:
        return (1 if rounds is None else rounds), None
    newest = CheckpointDir(checkpoint_dir).newest_round_number()
    return newest + more_rounds, newest


def _parse_shares(text: Optional[str]) -> Optional[list[float]]:
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise BadInput(f"--shares: expected comma-separated numbers like 3,1,1, got {text!r}") from None
    for value in values:
        positive("--shares", value)  # inf and nan were accepted
    return values


def _render_run(summary: dict) -> None:
    p, span = summary["plan"], summary["batch_makespan_s"]
    stdout.print(f"psl run: {p['model']}, {p['clients']} clients, {p['helpers']} helpers ({p['method']} plan), "
                 f"{summary['rounds']} rounds, {summary['batches']} batches per client in {summary['wall_s']:.1f} s"
                 + (f" (from round {summary['start_round']})" if summary["start_round"] else ""))
    if span is None:  # resumed with nothing left to run: the checkpoint's model was tested and saved
        _render_outputs(summary, [])
        return
    stdout.print(f"batch makespan: median {span['median'] * 1e3:.1f} ms (min {span['min'] * 1e3:.1f}, max "
                 f"{span['max'] * 1e3:.1f}; first batch {span['first'] * 1e3:.1f}); plan predicted "
                 f"{summary['predicted_makespan_s'] * 1e3:.1f} ms ({summary['measured_vs_predicted']:+.1%})"
                 + ("" if not p["preemptive"] else
                    f"; the plan's order run without preemption replays at {summary['replayed_makespan_s'] * 1e3:.1f} ms"))
    table = Table(box=None, pad_edge=False)
    for col in ("client", "helper", "planned c_j ms", "measured c_j ms (median)"):
        table.add_column(col)
    for c, row in summary["clients"].items():
        table.add_row(c, row["helper"], f"{row['planned_completion_s'] * 1e3:.1f}", f"{row['median_completion_s'] * 1e3:.1f}")
    stdout.print(table)
    if summary["order"] == "plan":
        followed = "helpers followed the plan's order" if summary["helper_order_followed"] else \
            "HELPER ORDER DIFFERED FROM THE PLAN"
    else:
        followed = "ltf orders run: " + "; ".join(f"{h}: " + ", ".join(f"{k} x{n}" for k, n in runs.items())
                                                  for h, runs in summary["helper_orders"].items())
    _render_outputs(summary, [f"loss {summary['loss']:.4f}", f"FedAvg {summary['fedavg_s'] * 1e3:.1f} ms per round",
                              followed])


def _render_outputs(summary: dict, parts: list[str]) -> None:
    if summary["test_accuracy"] is not None:
        parts.append(f"test accuracy {summary['test_accuracy']:.1%}")
    if parts:
        stdout.print("; ".join(parts))
    if summary["saved_model"]:
        note(f"saved model: {summary['saved_model']}")
    if summary["trace"]:
        note(f"wrote {summary['trace']} (open in https://ui.perfetto.dev)")


def register(app: typer.Typer) -> None:
    psl = typer.Typer(name="psl", help="Parallel split learning: clients own data and run parts 1 and 3, helpers run "
                      "part 2 for several clients.\n" + EXAMPLES, no_args_is_help=True, add_completion=False,
                      rich_markup_mode=None)
    for name, command in (("plan", plan_command), ("simulate", simulate_command), ("run", run_psl)):
        psl.command(name, help=(command.__doc__ or "") + "\n" + EXAMPLES)(command)
    app.add_typer(psl, name="psl")
