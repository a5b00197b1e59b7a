"""`hppctl run`: train a plan on real worker processes, one per device (docs/runtime.md)."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
from pathlib import Path
from typing import Annotated, Optional

import typer

from hppctl.cli.flags import MIN_PERIOD_S, check_optimizer_flags, divergence_factor as check_divergence_factor, positive, seconds, seed as check_seed, threads as check_threads
from hppctl.cli.output import LOG_EVERY_HELP, emit_json, note, phase, progress_log, stderr, stdout, writable_path
from hppctl.errors import BadInput
from hppctl.runtime.progress import report_every

EXAMPLES = """
Examples (from the repository root; files in examples/, outputs under out/):

\b
  hppctl run --plan examples/plan-local.yaml --cluster examples/local.yaml --dataset digits --epochs 2
  hppctl run --plan examples/plan-local.yaml --cluster examples/local.yaml --rounds 200 --checkpoint-dir out/ck --resume --metrics out/m.jsonl
  hppctl run --plan examples/plan-local.yaml --cluster examples/local.yaml --profile examples/local-tiny-cnn.json --trace out/run-trace.json --json
  hppctl run --plan examples/plan-local.yaml --cluster examples/local.yaml --dataset mypkg.data:make_dataset --save-model out/model.pt
  hppctl run --plan examples/plan-local.yaml --cluster examples/local.yaml --dataset digits --checkpoint-dir out/ck --resume --more-rounds 20 --save-model out/model.pt
  hppctl run --plan examples/plan-local-pp.yaml --cluster examples/local.yaml --dataset digits --epochs 2 --init-from out/model.pt
  hppctl run --plan examples/plan-local.yaml --cluster examples/local.yaml --dataset digits --epochs 8 --lr-schedule cosine --bn-recalibrate 512
  hppctl run --plan examples/galaxy-local.yaml --cluster examples/local.yaml --seq-len 284 --repeat 5 --output out/hidden.pt --json
"""


def run_command(
    plan: Annotated[Optional[Path], typer.Option("--plan", help="Plan file from `hppctl plan`. Required.")] = None,
    cluster: Annotated[Optional[Path], typer.Option("--cluster", help="Cluster inventory naming the plan's devices (local: or host:). Required.")] = None,
    profile: Annotated[Optional[Path], typer.Option("--profile", help="The profile the plan was made from: its digest must match.")] = None,
    rounds: Annotated[Optional[int], typer.Option("--rounds", help="Rounds (global batches) to train in total.")] = None,
    epochs: Annotated[Optional[int], typer.Option("--epochs", help="Epochs to train (rounds = epochs x floor(samples / global batch)). Default 1.")] = None,
    dataset: Annotated[str, typer.Option("--dataset", help="synthetic, digits, or package.module:factory.")] = "synthetic",
    seed: Annotated[int, typer.Option("--seed", help="Weights, sample order and dropout derive from it (0 to 2^32 - 1).")] = 0,
    optimizer: Annotated[Optional[str], typer.Option("--optimizer", help="sgd (with --momentum) or adam. Default: per model family, printed (docs/runtime.md); on --resume, the checkpoint's.")] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", help="Learning rate (the peak, under a schedule). Default: the family's (adam), 0.05 for sgd.")] = None,
    lr_schedule: Annotated[Optional[str], typer.Option("--lr-schedule", help="constant (default), or cosine: decays to 0 over the run's rounds (after any warm-up).")] = None,
    warmup_rounds: Annotated[int, typer.Option("--warmup-rounds", help="Rounds of linear warm-up to --lr.")] = 0,
    bn_recalibrate: Annotated[int, typer.Option("--bn-recalibrate", help="After training, re-estimate BatchNorm statistics over N training samples before saving and testing (0: keep the running averages).")] = 0,
    momentum: Annotated[Optional[float], typer.Option("--momentum", help="SGD momentum (default 0.9).")] = None,
    weight_decay: Annotated[Optional[float], typer.Option("--weight-decay", help="L2 weight decay (default 0).")] = None,
    checkpoint_dir: Annotated[Optional[Path], typer.Option("--checkpoint-dir", help="Per-stage checkpoints, written atomically; locked while the run lasts.")] = None,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every", help="Checkpoint every K rounds (and at the end).")] = 1,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the newest complete round in --checkpoint-dir (re-cut to this plan's stages if another plan of the model wrote it).")] = False,
    more_rounds: Annotated[Optional[int], typer.Option("--more-rounds", help="With --resume: train N rounds past the checkpoint's newest round (from 0 if it has none), so one command continues every day; the learning-rate schedule restarts over them.")] = None,
    more_epochs: Annotated[Optional[int], typer.Option("--more-epochs", help="As --more-rounds, counted in epochs.")] = None,
    init_from: Annotated[Optional[Path], typer.Option("--init-from", help="Start from trained weights: a --save-model file or a checkpoint directory (optimizer, round count and schedule start afresh; ignored when --resume finds a round to continue).")] = None,
    rejoin: Annotated[bool, typer.Option("--rejoin", help="With --resume after fault tolerance re-planned the run: continue on --plan as given, devices lost before included (default: on the re-planned plan).")] = False,
    metrics: Annotated[Optional[Path], typer.Option("--metrics", help="Per-round metrics, one JSON object per line.")] = None,
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Chrome/Perfetto trace of the run (the simulator's layout).")] = None,
    save_model: Annotated[Optional[Path], typer.Option("--save-model", help="Write the trained model as one state dict (the model's own parameter names).")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch threads per worker, at most 1024 (default: cores / local workers; SSH workers follow OMP_NUM_THREADS).")] = None,
    listen: Annotated[Optional[str], typer.Option("--listen", help="HOST[:PORT] for the run's store (default 127.0.0.1, or the address that reaches the SSH devices).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for workers to join and for any transfer (1 to 2592000, 30 days).")] = 300.0,
    log: Annotated[Optional[Path], typer.Option("--log", help="Append every worker's output here, prefixed by device.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON summary on stdout.")] = False,
    log_every: Annotated[Optional[float], typer.Option("--log-every", metavar="SECONDS", help=LOG_EVERY_HELP)] = None,
    text: Annotated[Optional[str], typer.Option("--input", help="Inference plans: the request's text (UTF-8 bytes as ids unless an hf: checkpoint has a tokenizer).")] = None,
    input_ids: Annotated[Optional[Path], typer.Option("--input-ids", help="Inference plans: token ids, a JSON list or a torch.save'd tensor.")] = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="Inference plans: N random token ids (default: the plan's length).")] = None,
    repeat: Annotated[int, typer.Option("--repeat", help="Inference plans: timed forward passes (latency statistics).")] = 1,
    warmup: Annotated[int, typer.Option("--warmup", help="Inference plans: untimed passes first.")] = 0,
    overlap: Annotated[bool, typer.Option("--overlap/--no-overlap", help="Inference plans (galaxy): tile-based overlap of the ring collectives with the GEMMs.")] = True,
    output: Annotated[Optional[Path], typer.Option("--output", help="Inference plans: save the final hidden states ([sequence, hidden]) with torch.save.")] = None,
    wire_dtype: Annotated[str, typer.Option("--wire-dtype", help="Inference plans: float32 (exact) or float16 activations on the wire (the paper's fp16 traffic).")] = "float32",
    heartbeat: Annotated[float, typer.Option("--heartbeat", help="Fault tolerance (with --profile): seconds between heartbeats (0.01 to 2592000).")] = 1.0,
    failure_timeout: Annotated[float, typer.Option("--failure-timeout", help="Fault tolerance: seconds of silence before a device is suspect (a probe decides); more than --heartbeat.")] = 3.0,
    probe_timeout: Annotated[float, typer.Option("--probe-timeout", help="Fault tolerance: seconds a suspect has to answer the probe (0.01 to 2592000).")] = 2.0,
    replan: Annotated[str, typer.Option("--replan", help="On a lost device (needs --profile): light, heavy, or off (the run fails). docs/fault-tolerance.md")] = "light",
    replicate_every: Annotated[int, typer.Option("--replicate-every", help="Fault tolerance: snapshot and back up stage state every K rounds.")] = 1,
    divergence_factor: Annotated[float, typer.Option("--divergence-factor", help="Stop the run with exit 4 (diverged) at a NaN or infinite loss, or a loss above this many times the mean of the first (up to 3) rounds; 0 turns the check off.")] = 10.0,
    schedule: Annotated[Optional[str], typer.Option("--schedule", help="Asynchronous training instead of the plan's rounds: nf1b (TiMePReSt) or pipedream; one device per stage, a round is an epoch (docs/timeprest.md).")] = None,
) -> None:
    """Train an HPP plan, or run collaborative inference on an inference (Galaxy) plan: one worker process per device, gloo for tensors."""
    from hppctl.models.cluster import ClusterSpec
    from hppctl.models.plan import HppPlan
    from hppctl.models.profile import Profile
    from hppctl.runtime.checkpoint import CheckpointDir
    from hppctl.runtime.config import TrainOptions
    from hppctl.runtime.preflight import check_bipartition_run, check_checkpoint, preflight
    from hppctl.store import load

    if plan is None:
        raise BadInput("--plan: required (a plan file from `hppctl plan`)")
    if cluster is None:
        raise BadInput("--cluster: required (the inventory naming the plan's devices)")
    from hppctl.runtime.bootstrap import check_listen
    check_listen(listen)
    check_seed("--seed", seed)
    check_threads("--threads", threads)
    seconds("--timeout", timeout)
    seconds("--log-every", log_every, low=MIN_PERIOD_S)
    check_divergence_factor("--divergence-factor", divergence_factor)
    # Every output, before the plan is even read (its kind decides which flags apply; a flag that does
    # not apply is refused below): `--save-model /dev/null` was refused only after training.
    for flag, path in (("--metrics", metrics), ("--trace", trace), ("--save-model", save_model), ("--log", log),
                       ("--output", output)):
        writable_path(flag, path)
    from hppctl.cli.galaxy import is_inference_file
    if is_inference_file(plan):  # collaborative inference (issue 8)
        _refuse_training_only(plan, {"--init-from": init_from, "--more-rounds": more_rounds, "--more-epochs": more_epochs})
        from hppctl.cli.galaxy import run_inference_command
        return run_inference_command(plan, cluster, text=text, input_ids=input_ids, seq_len=seq_len, repeat=repeat,
                                     warmup=warmup, overlap=overlap, output=output, as_json=as_json, threads=threads,
                                     seed=seed, listen=listen, timeout=timeout, log=log, wire_dtype=wire_dtype,
                                     log_every=log_every)
    from hppctl.cli.psl import is_psl_file
    _refuse_inference_flags(plan, "psl" if is_psl_file(plan) else "hpp", {
        "--input": text, "--input-ids": input_ids, "--seq-len": seq_len, "--output": output,
        "--repeat": None if repeat == 1 else repeat, "--warmup": warmup or None,
        "--no-overlap": None if overlap else True, "--wire-dtype": None if wire_dtype == "float32" else wire_dtype})
    if is_psl_file(plan):  # parallel split learning (issue 11); `hppctl psl run` has its PSL-only flags
        from hppctl.cli.psl import run_psl
        for flag, value in (("--epochs", epochs), ("--checkpoint-dir", checkpoint_dir), ("--profile", profile),
                            ("--trace", trace), ("--lr-schedule", lr_schedule),
                            ("--warmup-rounds", warmup_rounds or None), ("--bn-recalibrate", bn_recalibrate or None),
                            ("--init-from", init_from), ("--more-rounds", more_rounds), ("--more-epochs", more_epochs)):
            if value is not None:
                raise BadInput(f"{flag}: not supported for psl plans (see `hppctl psl run --help`)")
        return run_psl(plan, cluster, rounds=rounds or 1, dataset=dataset, seed=seed, optimizer=optimizer, lr=lr,
                       momentum=momentum, weight_decay=weight_decay, metrics=metrics, save_model=save_model,
                       threads=threads, listen=listen, timeout=timeout, log=log, as_json=as_json,
                       divergence_factor=divergence_factor, log_every=log_every)
    if rounds is not None and epochs is not None:
        raise BadInput("--rounds and --epochs: give one of them")
    _check_extension_flags(rounds=rounds, epochs=epochs, more_rounds=more_rounds, more_epochs=more_epochs,
                           resume=resume, schedule=schedule)
    for flag, value in (("--rounds", rounds), ("--epochs", epochs), ("--checkpoint-every", checkpoint_every)):
        positive(flag, value)
    from hppctl.cli.coordinator import check_recovery_flags
    check_recovery_flags(heartbeat=heartbeat, timeout=failure_timeout, probe_timeout=probe_timeout, replan=replan,
                         replicate_every=replicate_every)
    check_optimizer_flags(optimizer, lr, momentum, weight_decay)
    if resume and checkpoint_dir is None:
        raise BadInput("--resume: needs --checkpoint-dir")
    if rejoin and not resume:
        raise BadInput("--rejoin: goes with --resume")
    if lr_schedule not in (None, "constant", "cosine"):
        raise BadInput(f"--lr-schedule: unknown value {lr_schedule!r} (constant or cosine)")
    positive("--warmup-rounds", warmup_rounds, allow_zero=True)
    positive("--bn-recalibrate", bn_recalibrate, allow_zero=True)
    if bn_recalibrate == 1:
        raise BadInput("--bn-recalibrate: 1 sample has no batch statistics (give 2 or more, or 0)")
    for flag, path, suffixes in (("--metrics", metrics, (".jsonl", ".json")), ("--trace", trace, (".json",))):
        if path is not None and path.suffix.lower() not in suffixes:
            raise BadInput(f"{flag}: {path}: use a {' or '.join(suffixes)} file")
    writable_path("--checkpoint-dir", checkpoint_dir, directory=True)

    hpp = load(plan, HppPlan)
    inventory = load(cluster, ClusterSpec)
    prof = load(profile, Profile) if profile is not None else None
    check_bipartition_run(hpp, str(plan), resume=resume, checkpoint_dir=checkpoint_dir, schedule=schedule,
                          fault_tolerance=prof is not None and replan != "off")
    lineage = None
    if resume:
        hpp, prof, lineage = _plan_to_resume(checkpoint_dir, hpp, prof, plan, rejoin)
    data = preflight(hpp, inventory, dataset, profile=prof, plan_source=str(plan), cluster_source=str(cluster),
                     profile_source=str(profile))
    per_epoch = len(data.train) // hpp.global_batch
    total = rounds if rounds is not None else (epochs or 1) * per_epoch
    window = None
    if schedule is not None:  # an asynchronous window per epoch: rounds are epochs
        from hppctl.runtime.async_exec.plans import epoch_schedule
        if rounds is not None:
            raise BadInput(f"--rounds: --schedule {schedule} trains whole epochs; use --epochs")
        window, total = epoch_schedule(hpp, schedule, dataset), epochs or 1
    extending = more_rounds is not None or more_epochs is not None
    # counted before the lock is held; Session checks it again once it is (`expected_start`)
    schedule_start = CheckpointDir(checkpoint_dir).newest_round_number() if extending else 0
    if extending:  # N rounds past the newest one: the same command continues the run each time
        total = schedule_start + (more_rounds or more_epochs * (1 if window is not None else per_epoch))
    if warmup_rounds >= total - schedule_start:
        raise BadInput(f"--warmup-rounds: {warmup_rounds} leaves none of the run's {total - schedule_start} rounds "
                       f"at --lr")
    initial_state = _initial_state(init_from, hpp.model, checkpoint_dir if resume else None)
    local = [d for d in hpp.devices() if inventory.device(d).local]
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // len(local)) if len(local) == len(hpp.devices()) else 0
    from hppctl.runtime.optimizer_defaults import recorded_settings, resolve
    chosen = resolve(hpp.model, optimizer=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay,
                     lr_schedule=lr_schedule, warmup_rounds=warmup_rounds or None,
                     recorded=recorded_settings(checkpoint_dir) if resume else None)
    options = TrainOptions(dataset=dataset, seed=seed, rounds=total, **chosen.as_options(), schedule_start=schedule_start,
                           checkpoint_every=checkpoint_every if checkpoint_dir else 0,
                           threads=threads, trace=trace is not None, timeout_s=timeout,
                           divergence_factor=divergence_factor, progress_every_s=report_every(log_every))
    from hppctl.cli.coordinator import recovery_options
    recovery = recovery_options(prof, heartbeat=heartbeat, timeout=failure_timeout, probe_timeout=probe_timeout,
                                replan=replan, replicate_every=replicate_every) if window is None else None
    for line in check_checkpoint(checkpoint_dir, hpp, options, resume=resume) if checkpoint_dir else ():
        note(line)  # the lock file and the round to resume, before anything starts (runtime/preflight.py)
    lines = progress_log(log_every)
    with lines or contextlib.nullcontext():
        summary = train(hpp, inventory, options, data, checkpoint_dir=checkpoint_dir, resume=resume, metrics=metrics,
                        trace=trace, save_model=save_model, listen=listen, log=log, plan_source=str(plan),
                        schedule=window, recovery=recovery, lineage=lineage, bn_recalibrate=bn_recalibrate,
                        lines=lines, initial_state=initial_state,
                        expected_start=schedule_start if extending else None,
                        announce=chosen.line())
    summary["init_from"] = str(init_from) if initial_state is not None else None
    summary["optimizer"] = {**chosen.as_options(), "source": chosen.source}
    if as_json:
        emit_json(summary)
    else:
        render(summary)


def _refuse_training_only(plan_file: Path, given: dict) -> None:
    """Flags only training plans use, on an inference plan (flag -> value, None when not given)."""
    for flag, value in given.items():
        if value is not None:
            raise BadInput(f"{flag}: only for training plans; {plan_file} is an inference (galaxy) plan")


def _check_extension_flags(*, rounds, epochs, more_rounds, more_epochs, resume, schedule) -> None:
    """`--more-rounds`/`--more-epochs` count past the checkpoint's newest round: they need --resume and
    replace --rounds/--epochs (totals), and an asynchronous schedule counts in epochs."""
    given = [f for f, v in (("--more-rounds", more_rounds), ("--more-epochs", more_epochs)) if v is not None]
    if not given:
        return
    flag = given[0]
    if len(given) > 1:
        raise BadInput("--more-rounds and --more-epochs: give one of them")
    positive(flag, more_rounds if more_rounds is not None else more_epochs)
    for total_flag, value in (("--rounds", rounds), ("--epochs", epochs)):
        if value is not None:
            raise BadInput(f"{flag}: counts past the checkpoint's newest round; {total_flag} gives the total "
                           f"instead: give one of them")
    if not resume:
        raise BadInput(f"{flag}: goes with --resume and --checkpoint-dir (it counts past the newest round there)")
    if schedule is not None and more_rounds is not None:
        raise BadInput(f"--more-rounds: --schedule {schedule} trains whole epochs; use --more-epochs")


def _initial_state(init_from: Path | None, model: str, resume_dir: Path | None) -> dict | None:
    """The weights `--init-from` gives (checked: runtime/warmstart.py), or None: not given, or a
    `--resume` that finds a round to continue, which wins (so one cron line works from its first
    day, when the checkpoint directory is still empty, and every day after)."""
    from hppctl.runtime.checkpoint import CheckpointDir

    if init_from is None:
        return None
    if resume_dir is not None:
        newest = CheckpointDir(resume_dir).newest_round_number()
        if newest:
            note(f"--init-from: not used: --resume continues from round {newest} of {resume_dir}")
            return None
    from hppctl.runtime.warmstart import load_initial_state

    return load_initial_state(init_from, model)


def _refuse_inference_flags(plan_file: Path, kind: str, given: dict) -> None:
    """Flags only inference plans use, on a training plan: `--input-ids` was silently ignored (the run
    trained as if it had not been given). `given`: flag -> value, None when left at its default."""
    for flag, value in given.items():
        if value is not None:
            raise BadInput(f"{flag}: only for inference (galaxy) plans; {plan_file} is a {kind} training plan")


def _plan_to_resume(checkpoint_dir: Path, plan, profile, plan_file: Path, rejoin: bool = False):
    """(plan, profile, lineage) to resume on: a checkpoint that fault tolerance re-planned continues on
    its re-planned plan, over the profile of the devices left (the re-planned plan was made from it),
    unless `rejoin`; a checkpoint of another plan of the same model is re-cut to `plan`'s stages."""

    from hppctl.planner.replan import without_devices
    from hppctl.runtime.checkpoint import CheckpointDir, plan_to_resume, refuse_unless_recuttable, stages_line
    from hppctl.runtime.session import Lineage, plan_digest, plan_document

    meta = CheckpointDir(checkpoint_dir).newest_meta()
    resumed, lineage = (plan, Lineage(origin=plan_digest(plan))) if rejoin else plan_to_resume(meta, plan)
    if resumed is plan:
        if meta is not None and meta.get("plan") != plan_document(plan):
            refuse_unless_recuttable(meta["_file"], meta.get("plan"), plan_document(plan))  # before any worker
            note(f"--resume: round {meta['round']} was written by another plan of {plan.model}; its state is re-cut to "
                 f"{plan_file}'s stages")
        return plan, profile, lineage
    note(f"--resume: fault tolerance re-planned {plan_file} without {', '.join(lineage.lost)}; resuming on the "
         f"plan the run ended with: {stages_line(plan_document(resumed))} (--rejoin when it is back)")
    # a profile without those devices is refused by preflight, naming the digest that does not match
    if profile is not None and set(lineage.lost) <= {d.name for d in profile.devices}:
        profile = without_devices(profile, lineage.lost)
    return resumed, profile, lineage


def train(plan, cluster, options, data, *, checkpoint_dir=None, resume=False, metrics=None, trace=None,
          save_model=None, listen=None, log=None, plan_source="plan", quiet=False, schedule=None, recovery=None,
          lineage=None, bn_recalibrate=0, lines=None, initial_state=None, expected_start=None, announce=None) -> dict:
    """Run the session with progress on stderr; write metrics, trace and model; return the summary.

    announce: a line for stderr once the run holds its checkpoint lock (the optimizer chosen for the
    user): after every refusal, which must stay the one `error:` line it is.

    bn_recalibrate: re-estimate BatchNorm statistics over this many training samples before saving
    and testing the model (0: keep the running averages the workers trained).
    lines: a `ProgressLog` (cli/output.py `progress_log`) for timestamped progress lines, or None.
    initial_state, expected_start: `RunRequest`'s (runtime/session.py)."""
    from hppctl.runtime.results import save_model as write_model
    from hppctl.runtime.session import RunRequest, Session
    from hppctl.store import open_output_stream, write_text_atomic

    log_file = open_output_stream(log, append=True) if log else None  # appended to: a refused run adds nothing
    metrics_file = session = None
    try:
        request = RunRequest(plan, cluster, options, checkpoint_dir=checkpoint_dir, resume=resume,
                             listen=listen, log=log_file, schedule=schedule, lineage=lineage,
                             initial_state=initial_state, expected_start=expected_start)
        if recovery is not None:  # the embedded coordinator (docs/fault-tolerance.md)
            from hppctl.cli.coordinator import status_progress
            from hppctl.runtime.recovery import ResilientSession
            session = ResilientSession(request, recovery)
        else:
            session = Session(request)
        session.lock_checkpoint()  # another run active: exit 75 before any output, --metrics untouched
        if announce and not quiet:
            note(announce)
        progress = status_progress(stderr, quiet) if recovery is not None else _training_bar(quiet)
        if metrics is not None:
            metrics_file = open_output_stream(metrics, append=resume)
        with progress:
            task = progress.add_task("rounds", total=options.rounds, status="starting workers")
            result = _run_session(session, progress, task, options, metrics_file, lines,
                                  "epoch" if schedule is not None else "round", recovery is not None)
            progress.update(task, completed=options.rounds)
        if lines is not None:
            lines.end()
    finally:
        if session is not None:
            session.unlock_checkpoint()
        if metrics_file is not None:
            metrics_file.close()
        if log_file is not None:
            log_file.close()
    state = result.model_state()
    recalibration = None
    if bn_recalibrate:
        state, recalibration = _recalibrate(plan, options, data, state, bn_recalibrate, lines, quiet)
    if save_model is not None or (trace is not None and result.trace is not None):
        with phase(lines, "saving", quiet=quiet):
            if save_model is not None:
                write_model(plan.model, state, save_model)
            if trace is not None and result.trace is not None:
                write_text_atomic(trace, json.dumps(result.trace) + "\n")
    test_accuracy = _test_pass(plan.model, state, data.test, lines, quiet) if data.test is not None else None
    summary = summarize(plan, options, result, test_accuracy, plan_source=plan_source, checkpoint_dir=checkpoint_dir,
                        metrics=metrics, trace=trace, save_model=save_model)
    summary["bn_recalibration"] = recalibration
    if recovery is not None:  # the plan the run ended with, and what happened on the way
        final = session.plan
        summary.update(events=session.events, final_stages=[{"layers": s.layers, "devices": s.devices,
                                                             "samples": s.samples} for s in final.stages])
    return summary


def _training_bar(quiet: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[bold]training[/]"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=stderr,
                    disable=quiet, transient=False)


def _run_session(session, progress, task, options, metrics_file, lines, word: str, resilient: bool):
    """`session.run` with its reports shown: rounds, events and in-round steps on the bar (status
    and a fractional position, so an nf1b epoch moves by micro-batch), and on `lines`. `word`:
    what a round is called ("epoch" for an asynchronous window)."""
    total = options.rounds
    last = {"figures": ""}  # the last finished round's, repeated beside a step report

    def on_phase(name: str) -> None:
        if lines is not None:
            lines.begin(name, f"{len(session.topo.devices)} workers" if name == "workers" else f"{total} {word}s")

    def on_round(row: dict) -> None:
        if metrics_file is not None:
            metrics_file.write(json.dumps(row) + "\n")
            metrics_file.flush()
        status = f"loss {row['loss']:.4f}  {row['samples_per_s']:.1f} samples/s"
        last["figures"] = f" (last {word}: {status.replace('  ', ' ')})"
        progress.update(task, completed=row["round"] + 1, status=status)
        if lines is not None:
            lines.update(f"{word} {row['round'] + 1}/{total} {status.replace('  ', ' ')}")

    def on_step(step) -> None:
        status = f"{word} {step.round + 1}: {step.step_name()} {step.done}/{step.total}"
        progress.update(task, completed=step.position(), status=status)
        if lines is not None:
            lines.update(f"{word} {step.round + 1}/{total} {step.step_name()} {step.done}/{step.total}{last['figures']}")

    def on_event(message: str) -> None:
        progress.update(task, status=message)
        if lines is not None:
            lines.event(message)

    session.on_phase, session.on_step = on_phase, on_step
    if not resilient:
        return session.run(on_round=on_round, on_event=on_event)
    from hppctl.cli.coordinator import describe

    def on_fault(event: dict) -> None:  # fault events go to --metrics beside the rounds
        if metrics_file is not None:
            metrics_file.write(json.dumps(event) + "\n")
            metrics_file.flush()
        on_event(describe(event))

    def on_status(rows: list[dict]) -> None:
        progress.rows = rows

    def on_state(event) -> None:  # the coordinator's full event log (it keeps only the last ones)
        if metrics_file is not None:
            metrics_file.write(json.dumps({"event": "state", **event.model_dump(mode="json")}) + "\n")

    return session.run(on_round=on_round, on_event=on_event, on_fault=on_fault, on_status=on_status,
                       on_state=on_state)


def _test_pass(model: str, state: dict, split, lines, quiet: bool, name: str = "test pass") -> float:
    from hppctl.runtime.results import accuracy, evaluation_batches

    with phase(lines, name, total=evaluation_batches(split), unit="batches", quiet=quiet) as update:
        return accuracy(model, state, split, on_batch=lambda done, total: update(done))


def _recalibrate(plan, options, data, state: dict, samples: int, lines=None, quiet=False) -> tuple[dict, dict | None]:
    """Precise BatchNorm (runtime/results.py) over the first `samples` of epoch 0's sample order, in
    the plan's micro-batches; also the test accuracy with the trained running averages, for comparison."""
    from hppctl.runtime.data import SampleOrder
    from hppctl.runtime.results import recalibrate_batchnorm

    order = SampleOrder(len(data.train), plan.global_batch, plan.micro_batch, options.seed)
    indices = order.permutation(0)[:samples]
    with phase(lines, "BatchNorm recalibration", total=len(indices), unit="samples", quiet=quiet) as update:
        new = recalibrate_batchnorm(plan.model, state, data.train, indices, plan.micro_batch,
                                    on_batch=lambda done, total: update(done))
    if new is None:
        note(f"--bn-recalibrate: {plan.model} has no BatchNorm layer; the model is saved and tested as trained")
        return state, None
    before = (_test_pass(plan.model, state, data.test, lines, quiet, "test pass (running averages)")
              if data.test is not None else None)
    return new, {"samples": len(indices), "test_accuracy_running_averages": before}


def summarize(plan, options, result, test_accuracy, *, plan_source, checkpoint_dir, metrics, trace, save_model) -> dict:
    rows = result.rounds
    steady = [r["samples_per_s"] for r in rows[1:]] or [r["samples_per_s"] for r in rows]
    predicted = {d: m for s in plan.stages for d, m in zip(s.devices, s.memory_bytes)}
    last = rows[-1] if rows else {}
    return {
        "plan": plan_source, "model": plan.model, "strategy": plan.strategy, "dataset": options.dataset,
        "stages": [{"layers": s.layers, "devices": s.devices, "samples": s.samples} for s in plan.stages],
        "global_batch": plan.global_batch, "micro_batch": plan.micro_batch,
        "start_round": result.start_round, "rounds": options.rounds, "rounds_run": len(rows),
        "loss": last.get("loss"), "train_accuracy": last.get("train_accuracy"), "test_accuracy": test_accuracy,
        "samples_per_s": statistics.median(steady) if steady else None,
        "predicted_samples_per_s": plan.prediction.throughput_samples_per_s,
        "wall_s": result.wall_s,
        "memory": {d: {**m, "predicted_bytes": predicted.get(d)} for d, m in result.workers.items()},
        "checkpoint_dir": str(checkpoint_dir) if checkpoint_dir else None,
        "metrics": str(metrics) if metrics else None, "trace": str(trace) if trace else None,
        "saved_model": str(save_model) if save_model else None,
    }


def render(summary: dict) -> None:
    from hppctl.models.units import format_bytes

    shape = " | ".join(f"[{s['layers'][0]}, {s['layers'][1]}) on " + ", ".join(f"{d}:{y}" for d, y in zip(s["devices"], s["samples"]))
                       for s in summary["stages"])
    stdout.print(f"{summary['model']} ({summary['strategy']}): {shape}")
    acc = summary["test_accuracy"]
    parts = [f"rounds {summary['start_round']}..{summary['rounds']} ({summary['rounds_run']} run) in {summary['wall_s']:.1f} s"]
    if summary["loss"] is not None:
        parts.append(f"loss {summary['loss']:.4f}")
    if summary["samples_per_s"] is not None:
        parts.append(f"{summary['samples_per_s']:.1f} samples/s (plan predicted {summary['predicted_samples_per_s']:.1f})")
    if acc is not None:
        parts.append(f"test accuracy {acc:.1%}")
    stdout.print("; ".join(parts))
    recal = summary.get("bn_recalibration")
    if recal:
        before = recal["test_accuracy_running_averages"]
        note(f"BatchNorm statistics re-estimated over {recal['samples']} training samples"
             + (f" (test accuracy with the trained running averages: {before:.1%})" if before is not None else ""))
    for d, m in summary["memory"].items():
        stdout.print(f"  {d}: peak RSS {format_bytes(m['peak_rss_bytes'])} "
                     f"(process baseline {format_bytes(m['baseline_rss_bytes'])})")
    for key in ("init_from", "saved_model", "checkpoint_dir", "metrics", "trace"):
        if summary.get(key):  # (init_from: only `hppctl run` sets it)
            note(f"{key.replace('_', ' ')}: {summary[key]}")


def register(app: typer.Typer) -> None:
    app.command("run", help=(run_command.__doc__ or "") + "\n" + EXAMPLES)(run_command)
