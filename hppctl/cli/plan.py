"""`hppctl plan`: profile + request -> plan file; `--compare` all strategies; `--explain` the steps."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError
from rich.table import Table

from hppctl.cli.flags import MIN_PERIOD_S, positive, seconds
from hppctl.cli.output import emit_json, note, planning_progress, progress_log, stdout, writable_path
from hppctl.errors import BadInput, Infeasible
from hppctl.models.plan import HppPlan, PlanRequest
from hppctl.models.profile import Profile
from hppctl.models.units import format_bytes
from hppctl.store import load, read_document, save, validate

EXAMPLES = """
Examples (from the repository root; files in examples/ and profiles/, outputs under out/):

\b
  hppctl plan --profile profiles/example-tiny.json --global-batch 64 --micro-batch 16 --out out/plan.yaml
  hppctl plan --profile profiles/example-tiny.json --global-batch 64 --micro-batch 16 --compare
  hppctl plan --profile profiles/example-tiny.json --global-batch 64 --compare       # each strategy's best micro-batch
  hppctl plan --profile profiles/example-tiny.json --global-batch 64 --micro-batch auto --strategy dp
  hppctl plan --profile profiles/example-tiny.json --global-batch 64 --micro-batch 16 --strategy asteroid-paper --explain
  hppctl plan --profile profiles/example-tiny.json --plan out/plan.yaml --explain     # re-score a plan
  hppctl plan --profile examples/local-distilbert-284.json --seq-len 284 --compare    # inference (Galaxy)
  hppctl plan --profile examples/local-tiny-cnn.json --global-batch 64 --micro-batch auto --trial examples/local.yaml --out out/plan.yaml
"""


TRIAL_DEFAULTS = {"--trial-top": 3, "--trial-rounds": 8, "--trial-passes": 1, "--timeout": 300.0}
"""`hppctl plan --trial`'s flags and their defaults (given without --trial, a changed one is refused)."""

PLAN_LOG_EVERY_HELP = ("Where the planner is, as plain lines on stderr with a UTC timestamp: one every SECONDS "
                       "once planning has taken that long (default: 30 when stderr is not a terminal; a terminal "
                       "shows one line, rewritten in place; 0.01 to 2592000).")


def make_request(global_batch: int, micro_batch: int) -> PlanRequest:
    """Validate the request, naming the flag at fault."""
    for flag, value in (("--global-batch", global_batch), ("--micro-batch", micro_batch)):
        if value <= 0:
            raise BadInput(f"{flag}: must be a positive number of samples (got {value})")
        positive(flag, value)  # its upper bound: --global-batch 10**30 planned 2.5e29 micro-batches
    try:
        return PlanRequest(global_batch=global_batch, micro_batch=micro_batch)
    except ValidationError as e:
        if global_batch % micro_batch == 0:  # divides, but beyond the micro-batch limit (hppctl/limits.py)
            raise BadInput(f"--global-batch/--micro-batch: {e.errors()[0]['msg'].removeprefix('Value error, ')}") from None
        raise BadInput(f"--micro-batch: {micro_batch} does not divide --global-batch {global_batch}") from None


def micro_batch_flag(text: str | None) -> int | str | None:
    """`--micro-batch`: a whole number of samples or `auto` (None: not given)."""
    from hppctl.planner.micro_batch import AUTO

    if text is None or text == AUTO:
        return text
    try:
        return int(text.strip())
    except ValueError:
        raise BadInput(f"--micro-batch: must be a positive number of samples or {AUTO} (got {text[:40]!r})") from None


def check_global_batch(global_batch: int) -> int:
    """--global-batch alone (with --micro-batch auto, which `make_request` does not see)."""
    if global_batch <= 0:
        raise BadInput(f"--global-batch: must be a positive number of samples (got {global_batch})")
    return positive("--global-batch", global_batch)


def plan_command(
    profile: Annotated[Path, typer.Option("--profile", help="Profile file (.json/.yaml) from `hppctl profile`.")],
    global_batch: Annotated[Optional[int], typer.Option("--global-batch", help="Samples per training round.")] = None,
    micro_batch: Annotated[Optional[str], typer.Option("--micro-batch", metavar="N|auto", help="Samples per micro-batch (divides the global batch), or auto: each strategy's best from the divisors of the global batch the profile covers (docs/planner.md, \"Choosing the micro-batch\"; the default of --compare).")] = None,
    strategy: Annotated[Optional[str], typer.Option("--strategy", help="asteroid (default), asteroid-paper, dp, pp, pipedream, dapple, bipartition, bipartition-bsa, bipartition-paper, layerwise; on an inference profile galaxy, megatron, sp, local (default: the fastest predicted that fits).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the plan here (.json or .yaml).")] = None,
    compare: Annotated[bool, typer.Option("--compare", help="Evaluate every strategy on the same request.")] = False,
    explain_: Annotated[bool, typer.Option("--explain", help="Also the round step by step, with the paper's symbols (K, E_f, E_b, T_w, T_e, T_a) beside the plain words.")] = False,
    existing: Annotated[Optional[Path], typer.Option("--plan", help="Re-score an existing plan against --profile instead of planning.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="Inference profiles (Galaxy): plan for this sequence length; strategies galaxy, megatron, sp, local.")] = None,
    split_backward: Annotated[bool, typer.Option("--split-backward", help="Split every backward into its input-gradient half and a deferred weight-gradient half that fills the pipeline's idle time (zero-bubble; needs a profile with weight_grad_s; docs/schedule.md).")] = False,
    trial: Annotated[Optional[Path], typer.Option("--trial", metavar="CLUSTER", help="With --micro-batch auto: train the simulator's best candidates for a few rounds each on this cluster's devices (synthetic samples) and keep the fastest measured (docs/planner.md, \"Choosing by trial\").")] = None,
    trial_top: Annotated[int, typer.Option("--trial-top", help="--trial: how many of the best simulated candidates to train.")] = TRIAL_DEFAULTS["--trial-top"],
    trial_rounds: Annotated[int, typer.Option("--trial-rounds", help="--trial: rounds per candidate; the first 2 are warm-up, the median of the rest is its figure.")] = TRIAL_DEFAULTS["--trial-rounds"],
    trial_passes: Annotated[int, typer.Option("--trial-passes", help="--trial: train the candidates this many times, forwards then backwards (A B C, C B A, …), and rank them by the mean: on a machine whose speed drifts, 2 is fairer.")] = TRIAL_DEFAULTS["--trial-passes"],
    timeout: Annotated[float, typer.Option("--timeout", help="--trial: seconds to wait for workers to join and for any transfer (1 to 2592000).")] = TRIAL_DEFAULTS["--timeout"],
    log_every: Annotated[Optional[float], typer.Option("--log-every", metavar="SECONDS", help=PLAN_LOG_EVERY_HELP)] = None,
) -> None:
    """Plan hybrid pipeline parallel training (stages, device groups, samples per device), or collaborative inference on an inference profile (heads, MLP columns, sequence rows per device)."""
    from hppctl.planner.explain import check_plan_matches, explain

    writable_path("--out", out)  # before reading the profile and planning
    seconds("--log-every", log_every, low=MIN_PERIOD_S)
    micro_batch = micro_batch_flag(micro_batch)
    _check_trial_flags(trial, micro_batch, compare, existing, trial_top, trial_rounds, trial_passes, timeout)
    from hppctl.cli.galaxy import is_inference_document
    document = read_document(profile)  # once: parsing a 1000-layer profile takes ~0.4 s
    if is_inference_document(document):  # collaborative inference (issue 8)
        from hppctl.cli.galaxy import plan_inference
        _refuse_training_flags(profile, {"--plan": existing, "--explain": explain_ or None,
                                         "--global-batch": global_batch, "--micro-batch": micro_batch})
        if strategy is None and not compare:
            strategy = _fastest_inference_strategy(profile, seq_len)
        return plan_inference(profile, strategy or "galaxy", seq_len, out=out, compare=compare, as_json=as_json)
    if seq_len is not None:
        raise BadInput(f"--seq-len: {profile} is a training profile; profile with `hppctl profile --seq-len N` to plan inference")
    prof = validate(Profile, document, str(profile))
    from hppctl.zoo.user import declare_input
    declare_input(prof.model, prof.model_input)  # a user model's input, as the profile recorded it
    for missing in prof.missing_devices:  # a profile a failed `hppctl profile` run wrote
        note(f"note: {profile} has no measurement of {missing.name} ({missing.reason}); planning on the "
             f"{len(prof.devices)} devices it has")
    from hppctl.profiling.sanity import timing_warnings
    for line in timing_warnings(prof):  # a profile written before the check, or edited
        note(f"warning: {line}")
    if existing is not None:
        plan = load(existing, HppPlan)
        check_plan_matches(plan, prof, str(existing), str(profile))
        _show_rescored(plan, prof, explain_, as_json, explain, existing)
        return
    from hppctl.planner import forked
    # a large plan's loops may split with a forked child (planner/forked.py); where it is, on stderr
    with forked.allowed(), planning_progress(progress_log(log_every)):
        show = _plan_training(prof, profile, global_batch, micro_batch, strategy, compare, split_backward, trial,
                              trial_top, trial_rounds, trial_passes, timeout, out, explain_, as_json)
    show()  # after the progress line is gone


def _plan_training(prof: Profile, profile: Path, global_batch, micro_batch, strategy, compare: bool,
                   split_backward: bool, trial, trial_top: int, trial_rounds: int, trial_passes: int, timeout,
                   out, explain_: bool, as_json: bool):
    """`hppctl plan` of a training profile, its flags checked: --compare, --micro-batch auto, --trial or one
    plan. Returns what prints the result (and writes --out), for after planning."""
    from hppctl import planner
    from hppctl.planner.explain import explain
    if compare and micro_batch is None:
        micro_batch = "auto"
    if global_batch is None or micro_batch is None:
        raise BadInput("--global-batch and --micro-batch (a number or auto) are required "
                       "(or --plan FILE to re-score a plan)")
    request = None if micro_batch == "auto" else make_request(global_batch, micro_batch)
    if compare and split_backward:
        raise BadInput("--split-backward: plans one strategy; --compare ranks whole backwards (run it without "
                       "--split-backward, then plan the strategy you pick with it)")
    if compare:
        from hppctl.planner.micro_batch import compare_auto
        from hppctl.schedule import simulated_round_latency
        simulate = simulated_round_latency(prof)
        rows = (planner.compare(prof, request, simulate=simulate) if request is not None
                else compare_auto(prof, check_global_batch(global_batch), simulate=simulate))
        return lambda: (emit_json([r.as_json() for r in rows]) if as_json
                        else _render_compare(rows, global_batch, request, explain_))
    if request is None:
        from hppctl.planner.micro_batch import make_auto_plan
        from hppctl.schedule import simulated_round_latency
        simulate = _split_round_latency(prof, profile) if split_backward else simulated_round_latency(prof)
        if trial is not None:
            finish = (lambda p: _with_split_backward(p, prof, profile)) if split_backward else (lambda p: p)
            plan = _choose_by_trial(prof, profile, trial, check_global_batch(global_batch), strategy or "asteroid", simulate,
                                    finish, top=trial_top, rounds=trial_rounds, passes=trial_passes, timeout=timeout)
        else:
            plan = make_auto_plan(prof, check_global_batch(global_batch), strategy or "asteroid", simulate)
    else:
        plan = planner.make_plan(prof, request, strategy or "asteroid")
    if split_backward:
        plan = _with_split_backward(plan, prof, profile)

    def show() -> None:
        if out is not None:
            save(out, plan)
            note(f"wrote {out}")
        _show(plan, prof, explain_, as_json, explain)
    return show


def _check_trial_flags(trial: Path | None, micro_batch, compare: bool, existing: Path | None, top: int, rounds: int,
                       passes: int, timeout: float) -> None:
    """`--trial` and its flags, before anything is read; a trial flag without `--trial` is refused (it
    was silently ignored)."""
    from hppctl.cli.flags import seconds
    from hppctl.planner.micro_batch import TRIAL_WARMUP

    if trial is None:
        values = {"--trial-top": top, "--trial-rounds": rounds, "--trial-passes": passes, "--timeout": timeout}
        given = [flag for flag, default in TRIAL_DEFAULTS.items() if values[flag] != default]
        if given:
            raise BadInput(f"{given[0]}: goes with --trial CLUSTER (it sets how candidates are trained on it)")
        return
    if compare or existing is not None:
        raise BadInput(f"--trial: trains one strategy's candidates; not with {'--compare' if compare else '--plan'}")
    if micro_batch != "auto":
        raise BadInput("--trial: chooses the micro-batch by measuring candidates; give --micro-batch auto")
    positive("--trial-top", top)
    positive("--trial-rounds", rounds)
    positive("--trial-passes", passes)
    if rounds <= TRIAL_WARMUP:
        raise BadInput(f"--trial-rounds: {rounds} leaves no round after the {TRIAL_WARMUP} warm-up rounds "
                       f"(give at least {TRIAL_WARMUP + 1})")
    seconds("--timeout", timeout)


def _choose_by_trial(prof: Profile, profile_file: Path, cluster_file: Path, global_batch: int, strategy: str, simulate, finish,
                     *, top: int, rounds: int, passes: int, timeout: float) -> HppPlan:
    """The plan `--trial` keeps (hppctl/runtime/trial.py), after the cluster is checked to hold a
    machine for every device the profile plans on."""
    from hppctl.models.cluster import ClusterSpec
    from hppctl.planner.micro_batch import nothing_fits, try_micro_batches

    inventory = load(cluster_file, ClusterSpec)
    known = {d.name for d in inventory.devices}
    missing = [d.name for d in prof.devices if d.name not in known]
    if missing:
        raise BadInput(f"--trial: {cluster_file}: devices: no device {missing[0]!r} (the profile plans on it)")
    from hppctl.runtime.preflight import check_machines  # torch-free: a preset device has no machine to train on

    check_machines([("devices", d.name) for d in prof.devices], inventory, str(profile_file), str(cluster_file),
                   "`hppctl plan --trial`")
    tried = try_micro_batches(prof, global_batch, strategy, simulate)
    from hppctl.runtime.trial import choose_by_trial  # torch from here on: the planner above needs none

    plan = choose_by_trial(tried, inventory, top=top, rounds=rounds, passes=passes, finish=finish, timeout_s=timeout,
                           announce=note, where=str(cluster_file))
    if plan is None:
        raise Infeasible(nothing_fits(prof, global_batch, tried))
    return plan


def _with_split_backward(plan: HppPlan, prof: Profile, source: Path, *, refine: bool = True) -> HppPlan:
    from hppctl.schedule import split_backward_plan

    try:
        return split_backward_plan(plan, prof, refine=refine)
    except ValueError as e:
        raise BadInput(f"--split-backward: {source}: {e}") from None


def _split_round_latency(prof: Profile, source: Path):
    """What `--micro-batch auto --split-backward` ranks candidates by: each one's split form with its
    cuts tuned, simulated (the search can change the order: on Env B it lifts B = 64 past B = 32)."""
    def latency(plan: HppPlan) -> float:
        return _with_split_backward(plan, prof, source).prediction.round_latency_s
    return latency


def _fastest_inference_strategy(profile: Path, seq_len: int | None) -> str:
    """No --strategy on an inference profile: the fastest predicted, said on stderr with the figures."""
    from hppctl.models.inference import InferenceProfile
    from hppctl.planner.galaxy import choose_inference_strategy

    choice = choose_inference_strategy(load(profile, InferenceProfile), seq_len)
    note(choice.reason)
    return choice.strategy


def _refuse_training_flags(profile: Path, flags: dict[str, object]) -> None:
    """An inference profile plans from --seq-len alone: a training flag given with it was silently
    ignored (`--plan missing.yaml` printed a fresh plan, exit 0)."""
    given = [flag for flag, value in flags.items() if value is not None]
    if given:
        raise BadInput(f"{given[0]}: {profile} is an inference profile; {', '.join(given)} apply to training "
                       "profiles only (plan inference with --strategy and --seq-len)")


def _show(plan: HppPlan, profile: Profile, explain_: bool, as_json: bool, explain, differences=None,
          source: Path | None = None) -> None:
    """The plan (`--json`: its document, wrapped in {"plan", ...} when more goes with it), its steps
    under --explain, and with `differences` (a re-scored plan's) the stored numbers that differ."""
    if as_json:
        data = {"plan": plan.model_dump(mode="json")}
        if differences is not None:
            data["differences"] = [d.as_json() for d in differences]
        if explain_:
            data.update(steps=[_row_json(r) for r in explain(plan, profile)], timeprest=_timeprest(plan))
        emit_json(data if len(data) > 1 else data["plan"])
        return
    _render_plan(plan, explain_)
    if explain_:
        _render_explain(explain(plan, profile))
    if differences is not None:
        _render_differences(differences, source)


def _show_rescored(stored: HppPlan, profile: Profile, explain_: bool, as_json: bool, explain, source: Path) -> None:
    """`--plan FILE`: the plan shown with every number recomputed from the profile (the file's are
    claims), the stored ones beside them where they differ; exit 3 after the report when it does not
    fit the budgets (docs/planner.md, "Re-scoring a plan")."""
    from hppctl.planner.rescore import rescore

    rescored = rescore(stored, profile)
    plan = rescored.plan
    _show(plan, profile, explain_, as_json, explain, rescored.differences, source)
    worst = rescored.worst_violation
    if worst is not None:
        p = worst.stage
        i = plan.stages[p].devices.index(worst.device)
        raise Infeasible(f"{source}: stages.{p}.devices.{i}: device {worst.device} needs "
                         f"{format_bytes(worst.needed_bytes)} and has {format_bytes(worst.budget_bytes)} "
                         f"({format_bytes(worst.needed_bytes - worst.budget_bytes)} missing): the plan does not fit")


def _render_differences(differences, source: Path) -> None:
    if not differences:
        stdout.print(f"every number in {source} agrees with the profile")
        return
    stdout.print(f"{source} stores numbers the profile does not give (shown above: recomputed):")
    for d in differences:
        stdout.print(f"  {d.field}: stored {_value(d.field, d.stored)}, recomputed {_value(d.field, d.recomputed)}")


def _value(field: str, value) -> str:
    if isinstance(value, list):  # memory_violations: how many
        return f"{len(value)} entr{'y' if len(value) == 1 else 'ies'}"
    if isinstance(value, float):
        value = f"{value:.6g}"
    return f"{value} s" if field.endswith("_s") else str(value)


def _row_json(row) -> dict:
    return {
        "index": row.index, "kind": row.kind, "label": row.label, "forward_s": row.forward_s,
        "backward_s": row.backward_s, "wait_s": row.wait_s, "execute_s": row.execute_s,
        "allreduce_s": row.allreduce_s, "end_s": row.end_s, "dominant": row.dominant,
        "memory": [{"device": d, "bytes": b, "budget_bytes": u} for d, b, u in row.memory],
    }


def _memory_of_budget(used: int, budget: int) -> str:
    return f"{format_bytes(used)} of {format_bytes(budget)}"


# Plain column headers; the paper's symbol (Asteroid, MobiCom'24) joins them under --explain.
PLAN_COLUMNS = (("stage", ""), ("layers", ""), ("devices", ""), ("samples/device", ""), ("in flight", "K"),
                ("forward s", "E_f"), ("backward s", "E_b"), ("all-reduce s", "T_a"), ("peak memory of budget", ""))


def _render_plan(plan: HppPlan, explain_: bool = False) -> None:
    from hppctl.planner.explain import stage_layers

    pred = plan.prediction
    stdout.print(f"{plan.strategy} plan for {plan.model} ({plan.granularity}): global batch {plan.global_batch} = "
                 f"{plan.num_micro_batches} micro-batches x {plan.micro_batch} samples, schedule {plan.schedule}"
                 + (", split backward (weight gradients deferred into idle time)" if plan.split_backward else ""))
    table = Table(box=None, pad_edge=False)
    for plain, symbol in PLAN_COLUMNS:
        table.add_column(f"{plain} ({symbol})" if explain_ and symbol else plain)
    for p, s in enumerate(plan.stages):
        memory = ", ".join(_memory_of_budget(m, u) for m, u in zip(s.memory_bytes, s.memory_budget_bytes))
        table.add_row(str(p), stage_layers(s), ", ".join(s.devices), ", ".join(map(str, s.samples)),
                      str(s.in_flight_cap or s.warmup),
                      f"{s.forward_s:.4f}", f"{s.backward_s:.4f}", f"{s.allreduce_s:.4f}", memory)
    stdout.print(table)
    stdout.print("forward/backward s: one micro-batch on the stage's slowest device; all-reduce s: averaging the "
                 "stage's gradients across its devices, per round; in flight: most micro-batches a stage holds",
                 soft_wrap=True)
    figure = "simulated (split backward; cuts tuned by simulation)" if plan.split_backward else "predicted"
    stdout.print(f"{figure} round latency {pred.round_latency_s:.3f} s, throughput "
                 f"{pred.throughput_samples_per_s:.1f} samples/s, peak memory {pred.peak_memory_ratio:.0%} of budget, "
                 f"planned in {plan.planning_time_s:.2f} s")
    for v in plan.memory_violations:
        stdout.print(f"memory violation: {v.device} (stage {v.stage}) needs {format_bytes(v.needed_bytes)}, "
                     f"has {format_bytes(v.budget_bytes)}")
    if plan.micro_batch_choice is not None:
        stdout.print(describe_choice(plan.micro_batch_choice), soft_wrap=True)
    if explain_:
        _render_nf1b_what_if(plan)


def _distinct(a: float, b: float) -> tuple[str, str]:
    """Two throughputs with one decimal, or more where one decimal would print them alike."""
    for digits in (1, 2, 3, 4):
        if f"{a:.{digits}f}" != f"{b:.{digits}f}":
            break
    return f"{a:.{digits}f}", f"{b:.{digits}f}"


def describe_choice(choice) -> str:
    """One line: the micro-batch `auto` chose, the candidates, and the runner-up's figure."""
    scored = [c for c in choice.candidates if c.score(choice.ranked_by) is not None]
    won = next(c for c in scored if c.micro_batch == choice.chosen)
    others = sorted((c for c in scored if c is not won), key=lambda c: (-c.score(choice.ranked_by), c.micro_batch))
    sizes = "/".join(str(c.micro_batch) for c in choice.candidates)
    figure = {"simulated": "simulated", "measured": "measured on the cluster"}.get(choice.ranked_by, "predicted")
    if others:
        first, second = _distinct(won.score(choice.ranked_by), others[0].score(choice.ranked_by))
        versus = f"{first} vs {second} samples/s at {others[0].micro_batch}, the next best"
    else:
        versus = f"{won.score(choice.ranked_by):.1f} samples/s, the only one"
    skipped = [c for c in choice.candidates if c.skipped is not None]
    skipped_text = (f"; skipped {'/'.join(str(c.micro_batch) for c in skipped)} ({skipped[0].skipped}"
                    f"{', …' if len(skipped) > 1 else ''})" if skipped else "")
    return (f"micro-batch {choice.chosen} (auto: best {figure} of {sizes}: {versus}{skipped_text}; "
            "rule: docs/planner.md, \"Choosing the micro-batch\")")


def _render_nf1b_what_if(plan: HppPlan) -> None:
    """The plan's schedule is synchronous: what running it asynchronously would do is a what-if, shown
    with the other details under --explain (it printed for every plan, as if the plan were nf1b)."""
    from hppctl.schedule.async_version import describe_version_report

    report = _timeprest(plan)
    if report:
        stdout.print(f"if run asynchronously (hppctl run --schedule nf1b, TiMePReSt): "
                     f"{describe_version_report(report)}", soft_wrap=True)


def _timeprest(plan: HppPlan) -> dict | None:
    """Version difference of the plan run asynchronously with nf1b (docs/timeprest.md); one device per stage only."""
    from hppctl.schedule.async_version import plan_version_report

    if any(len(s.devices) != 1 for s in plan.stages):
        return None
    return plan_version_report(len(plan.stages), plan.num_micro_batches)


# The steps of Asteroid's round formula (Eqs. 4-6), each plain word with the paper's symbol beside it.
STEP_COLUMNS = ("step", "", "forward s (E_f)", "backward s (E_b)", "waits s (T_w)", "runs s (T_e)",
                "all-reduce s (T_a)", "ends at s", "peak memory of budget")


def _render_explain(rows) -> None:
    table = Table(box=None, pad_edge=False,
                  title="the round step by step (Asteroid's Eqs. 4-6); * = the step that sets the pace (dominant)")
    for col in STEP_COLUMNS:
        table.add_column(col)
    for r in rows:
        memory = ", ".join(f"{d} {_memory_of_budget(b, u)}" for d, b, u in r.memory)
        table.add_row(f"{r.index}{' *' if r.dominant else ''}", r.label, f"{r.forward_s:.4f}", f"{r.backward_s:.4f}",
                      f"{r.wait_s:.3f}", f"{r.execute_s:.3f}", f"{r.allreduce_s:.3f}", f"{r.end_s:.3f}", memory)
    stdout.print(table)
    stdout.print("waits: the forwards upstream of the step (T_w); runs: from its first forward to its last "
                 "backward (T_e); ends at: waits + runs + all-reduce, the part of it the stage's last backward does not "
                 "hide (the stage table's all-reduce s is all of it)", soft_wrap=True)


def _render_compare(rows, global_batch: int, request: PlanRequest | None, explain_: bool = False) -> None:
    """`request` None: --micro-batch auto, each row at its strategy's own micro-batch (its own column)."""
    title = (f"global batch {global_batch} = {request.num_micro_batches} micro-batches x {request.micro_batch} samples"
             if request is not None else f"global batch {global_batch}, micro-batch auto (each strategy's best)")
    table = Table(box=None, pad_edge=False, title=title)
    columns = ["strategy", "feasible", "simulated samples/s", "estimate samples/s", "round latency s (sim / est)",
               "peak memory", "stages", "plan time s"]
    if request is None:
        columns.insert(2, "micro-batch")
    for col in columns:
        table.add_column(col)
    for r in rows:
        sim = r.simulated_round_latency_s
        cells = [r.strategy, "yes" if r.feasible else ("no plan" if r.plan is None else "NO (memory)"),
                 f"{r.simulated_throughput:.1f}" if sim is not None else "-", f"{r.throughput:.1f}",
                 f"{sim:.3f} / {r.round_latency_s:.3f}" if sim is not None else "-",
                 f"{r.peak_memory_ratio:.0%}" if r.plan else "-", r.shape, f"{r.planning_time_s:.2f}"]
        if request is None:
            cells.insert(2, str(r.plan.micro_batch) if r.plan else "-")
        table.add_row(*cells)
    stdout.print(table)
    formula = " (Asteroid's closed form, Eqs. 4-6)" if explain_ else ""
    chosen = ("; micro-batch: the one of highest simulated throughput per strategy (docs/planner.md, \"Choosing the "
              "micro-batch\"), plan time: all its candidates" if request is None else "")
    stdout.print("ranked by the simulated figure (hppctl simulate: the plan's schedule replayed on the profile); "
                 f"the estimate is the planner's own formula{formula}; stages: devices per stage{chosen}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("plan", help=(plan_command.__doc__ or "") + "\n" + EXAMPLES)(plan_command)
