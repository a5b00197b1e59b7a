"""`hppctl run`: train a plan on real worker processes, one per device (docs/runtime.md)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, Optional

import typer

from hppctl.cli.flags import MIN_PERIOD_S, check_optimizer_flags, divergence_factor as check_divergence_factor, positive, seconds, seed as check_seed, threads as check_threads
from hppctl.cli.flags import precision as check_precision
from hppctl.cli.flags import WORKDIR_HELP, check_checkpoint_flags, check_extension_flags
from hppctl.cli.output import LOG_EVERY_HELP, emit_json, note, progress_log, stdout, writable_path
from hppctl.cli.view import TrainingView
from hppctl import driver
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
    dataset: Annotated[str, typer.Option("--dataset", help="synthetic, digits, package.module:factory, or a path: a folder of images (one sub-folder per class), a .pt or .npz tensor file, a .csv file (docs/runtime.md, Your data).")] = "synthetic",
    label_column: Annotated[Optional[str], typer.Option("--label-column", help="CSV datasets: the column holding the class index (default: the last one).")] = None,
    workdir: Annotated[Optional[Path], typer.Option("--workdir", help=WORKDIR_HELP)] = None,
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
    overlap: Annotated[bool, typer.Option("--overlap/--no-overlap", help="Inference plans (galaxy): --no-overlap runs every collective on plain rings (the ablation); by default the plan's per-collective choice.")] = True,
    output: Annotated[Optional[Path], typer.Option("--output", help="Inference plans: save the final hidden states ([sequence, hidden]) with torch.save.")] = None,
    wire_dtype: Annotated[str, typer.Option("--wire-dtype", help="Inference plans: float32 (exact) or float16 activations on the wire (the paper's fp16 traffic).")] = "float32",
    heartbeat: Annotated[float, typer.Option("--heartbeat", help="Fault tolerance (with --profile): seconds between heartbeats (0.01 to 2592000).")] = 1.0,
    failure_timeout: Annotated[float, typer.Option("--failure-timeout", help="Fault tolerance: seconds of silence before a device is suspect (a probe decides); more than --heartbeat.")] = 3.0,
    probe_timeout: Annotated[float, typer.Option("--probe-timeout", help="Fault tolerance: seconds a suspect has to answer the probe (0.01 to 2592000).")] = 2.0,
    replan: Annotated[str, typer.Option("--replan", help="On a lost device (needs --profile): light, heavy, or off (the run fails). docs/fault-tolerance.md")] = "light",
    replicate_every: Annotated[int, typer.Option("--replicate-every", help="Fault tolerance: snapshot and back up stage state every K rounds.")] = 1,
    divergence_factor: Annotated[float, typer.Option("--divergence-factor", help="Stop the run with exit 4 (diverged) at a NaN or infinite loss, or a loss above this many times the mean of the first (up to 3) rounds; 0 turns the check off.")] = 10.0,
    precision: Annotated[str, typer.Option("--precision", help="fp32 (default), fp16 (autocast, one loss scale for all stages) or bf16 (autocast); on each device's accelerator (docs/runtime.md).")] = "fp32",
    schedule: Annotated[Optional[str], typer.Option("--schedule", help="Asynchronous training instead of the plan's rounds: nf1b (TiMePReSt) or pipedream; one device per stage, a round is an epoch (docs/timeprest.md).")] = None,
) -> None:
    """Train an HPP plan, or run collaborative inference on an inference (Galaxy) plan: one worker process per device, gloo for tensors."""
    from hppctl.models.cluster import ClusterSpec
    from hppctl.models.plan import HppPlan
    from hppctl.models.profile import Profile
    from hppctl.runtime.checkpoint import CheckpointDir
    from hppctl.runtime.config import TrainOptions
    from hppctl.runtime.launch import default_threads, prepare_local_workers
    from hppctl.runtime.preflight import check_checkpoint, check_features, plan_kind_text, preflight
    from hppctl.schedule.nf1b import ASYNC_POLICIES
    from hppctl.store import load

    if plan is None:
        raise BadInput("--plan: required (a plan file from `hppctl plan`)")
    from hppctl.runtime.datasets import dataset_spec
    dataset = dataset_spec(dataset, label_column)  # one string to the workers and the checkpoint: PATH#label=NAME
    if cluster is None:
        raise BadInput("--cluster: required (the inventory naming the plan's devices)")
    from hppctl.runtime.bootstrap import check_listen
    check_listen(listen)
    check_seed("--seed", seed)
    check_threads("--threads", threads)
    seconds("--timeout", timeout)
    seconds("--log-every", log_every, low=MIN_PERIOD_S)
    check_divergence_factor("--divergence-factor", divergence_factor)
    check_precision("--precision", precision)
    # Every output, before the plan is even read (its kind decides which flags apply; a flag that does
    # not apply is refused below): `--save-model /dev/null` was refused only after training.
    for flag, path in (("--metrics", metrics), ("--trace", trace), ("--save-model", save_model), ("--log", log),
                       ("--output", output)):
        writable_path(flag, path)
    from hppctl.runtime.workdir import open_workdir, user_code
    shipped = open_workdir(workdir)  # first on the import path from here on
    if schedule is not None and schedule not in ASYNC_POLICIES:
        raise BadInput(f"--schedule: {schedule!r} is not an asynchronous schedule ({', '.join(ASYNC_POLICIES)})")
    requested = _requested_features(resume=resume, rejoin=rejoin, checkpoint_dir=checkpoint_dir,
                                    checkpoint_every=checkpoint_every, schedule=schedule, trace=trace, metrics=metrics,
                                    fault_tolerance=_fault_tolerance_flag(replan=replan, heartbeat=heartbeat,
                                                                          failure_timeout=failure_timeout,
                                                                          probe_timeout=probe_timeout,
                                                                          replicate_every=replicate_every))
    from hppctl.cli.galaxy import is_inference_file
    if is_inference_file(plan):  # collaborative inference (issue 8)
        _refuse_training_only(plan, {
            "--init-from": init_from, "--more-rounds": more_rounds, "--more-epochs": more_epochs, "--rounds": rounds,
            "--epochs": epochs, "--dataset": None if dataset == "synthetic" else dataset, "--label-column": label_column,
            "--optimizer": optimizer,
            "--lr": lr, "--lr-schedule": lr_schedule, "--warmup-rounds": warmup_rounds or None,
            "--bn-recalibrate": bn_recalibrate or None, "--momentum": momentum, "--weight-decay": weight_decay,
            "--save-model": save_model, "--profile": profile,
            "--divergence-factor": None if divergence_factor == 10.0 else divergence_factor})
        check_features("inference", f"{plan} is an inference (galaxy) plan", requested)
        from hppctl.cli.galaxy import run_inference_command
        return run_inference_command(plan, cluster, text=text, input_ids=input_ids, seq_len=seq_len, repeat=repeat,
                                     warmup=warmup, overlap=overlap, output=output, as_json=as_json, threads=threads,
                                     seed=seed, listen=listen, timeout=timeout, log=log, wire_dtype=wire_dtype,
                                     log_every=log_every, precision=precision, user_code=user_code(shipped))
    from hppctl.cli.psl import is_psl_file
    _refuse_inference_flags(plan, "psl" if is_psl_file(plan) else "hpp", {
        "--input": text, "--input-ids": input_ids, "--seq-len": seq_len, "--output": output,
        "--repeat": None if repeat == 1 else repeat, "--warmup": warmup or None,
        "--no-overlap": None if overlap else True, "--wire-dtype": None if wire_dtype == "float32" else wire_dtype})
    if is_psl_file(plan):  # parallel split learning (issue 11); `hppctl psl run` has its PSL-only flags
        from hppctl.cli.psl import run_psl
        # --profile (with --replan on) asks for fault tolerance: refused with the table's why, not as a stray flag
        asked = requested["fault tolerance"] or ("--profile" if profile is not None and replan != "off" else None)
        check_features("psl", f"{plan} is a psl plan", {**requested, "fault tolerance": asked})
        for flag, value in (("--epochs", epochs), ("--profile", profile), ("--lr-schedule", lr_schedule),
                            ("--warmup-rounds", warmup_rounds or None), ("--bn-recalibrate", bn_recalibrate or None),
                            ("--more-epochs", more_epochs), ("--rejoin", rejoin or None),
                            ("--precision", None if precision == "fp32" else precision)):
            if value is not None:
                raise BadInput(f"{flag}: not supported for psl plans (see `hppctl psl run --help`)")
        return run_psl(plan, cluster, rounds=rounds, dataset=dataset, seed=seed, optimizer=optimizer, lr=lr,
                       momentum=momentum, weight_decay=weight_decay, checkpoint_dir=checkpoint_dir,
                       checkpoint_every=checkpoint_every, resume=resume, more_rounds=more_rounds, init_from=init_from,
                       metrics=metrics, save_model=save_model,
                       trace=trace, threads=threads, listen=listen, timeout=timeout, log=log, as_json=as_json,
                       divergence_factor=divergence_factor, log_every=log_every, workdir=shipped)
    if rounds is not None and epochs is not None:
        raise BadInput("--rounds and --epochs: give one of them")
    check_extension_flags(rounds=rounds, epochs=epochs, more_rounds=more_rounds, more_epochs=more_epochs,
                          resume=resume, schedule=schedule)
    for flag, value in (("--rounds", rounds), ("--epochs", epochs), ("--checkpoint-every", checkpoint_every)):
        positive(flag, value)
    from hppctl.cli.coordinator import check_recovery_flags
    check_recovery_flags(heartbeat=heartbeat, timeout=failure_timeout, probe_timeout=probe_timeout, replan=replan,
                         replicate_every=replicate_every)
    check_optimizer_flags(optimizer, lr, momentum, weight_decay)
    check_checkpoint_flags(checkpoint_dir, checkpoint_every, resume)
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

    hpp = load(plan, HppPlan)
    from hppctl.zoo.user import declare_input
    declare_input(hpp.model, hpp.model_input)  # a user model's input, as the plan recorded it
    inventory = load(cluster, ClusterSpec)
    prof = load(profile, Profile) if profile is not None else None
    kind, what = plan_kind_text(hpp, str(plan), schedule)
    check_features(kind, what, {**requested, "fault tolerance": "--replan" if prof is not None and replan != "off"
                                else None})
    # after the refusals: a refused run (a Bi-Partition --resume) makes no checkpoint folder
    writable_path("--checkpoint-dir", checkpoint_dir, directory=True)
    # The local workers' fork server, before any other torch work here: this process imports torch and
    # forks it (the first torch computation must come after, runtime/zygote.py ForkedZygote); called
    # as a library, a fresh one imports torch beside the checks below, and a run refused ends it.
    prepare_local_workers(inventory, hpp.devices(), model=hpp.model, fork_from_here=True)
    lineage = None
    if resume:
        hpp, prof, lineage = driver.plan_to_resume(checkpoint_dir, hpp, prof, plan, rejoin, view=TrainingView())
    data = preflight(hpp, inventory, dataset, profile=prof, plan_source=str(plan), cluster_source=str(cluster),
                     profile_source=str(profile))
    from hppctl.runtime.accelerator import check_local_devices
    check_local_devices(inventory, hpp.devices(), precision, cluster_source=str(cluster))
    if precision != "fp32":  # said once: the summary's figures are of a mixed-precision run
        note(f"precision {precision}: forward passes under torch.autocast on each device's accelerator"
             f"{' (loss scale 1024, shared by every stage)' if precision == 'fp16' else ''}")
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
    initial_state = driver.initial_state(init_from, hpp.model, checkpoint_dir if resume else None, view=TrainingView())
    if threads is None:
        threads = default_threads(inventory, hpp.devices())
    from hppctl.runtime.optimizer_defaults import recorded_settings, resolve
    chosen = resolve(hpp.model, optimizer=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay,
                     lr_schedule=lr_schedule, warmup_rounds=warmup_rounds or None,
                     recorded=recorded_settings(checkpoint_dir) if resume else None)
    options = TrainOptions(dataset=dataset, seed=seed, rounds=total, **chosen.as_options(), schedule_start=schedule_start,
                           checkpoint_every=checkpoint_every if checkpoint_dir else 0,
                           threads=threads, trace=trace is not None, timeout_s=timeout,
                           divergence_factor=divergence_factor, progress_every_s=report_every(log_every),
                           precision=precision)
    from hppctl.cli.coordinator import describe
    recovery = driver.recovery_options(prof, heartbeat=heartbeat, timeout=failure_timeout,
                                       probe_timeout=probe_timeout, replan=replan, replicate_every=replicate_every)
    for line in check_checkpoint(checkpoint_dir, hpp, options, resume=resume) if checkpoint_dir else ():
        note(line)  # the lock file and the round to resume, before anything starts (runtime/preflight.py)
    lines = progress_log(log_every)
    with lines or contextlib.nullcontext():
        summary = driver.train(hpp, inventory, options, data, view=TrainingView(lines, describe=describe),
                               checkpoint_dir=checkpoint_dir, resume=resume, metrics=metrics, trace=trace,
                               save_model=save_model, listen=listen, log=log, plan_source=str(plan), schedule=window,
                               recovery=recovery, lineage=lineage, bn_recalibrate=bn_recalibrate,
                               initial_state=initial_state, expected_start=schedule_start if extending else None,
                               announce=chosen.line(),
                               user_code=user_code(shipped, dataset=dataset, model=hpp.model))
    summary["init_from"] = str(init_from) if initial_state is not None else None
    summary["optimizer"] = {**chosen.as_options(), "source": chosen.source}
    if as_json:
        emit_json(summary)
    else:
        render(summary)


def _requested_features(*, resume, rejoin, checkpoint_dir, checkpoint_every, schedule, trace, metrics,
                        fault_tolerance) -> dict[str, str | None]:
    """The features of runtime/preflight.py `FEATURES` the flags ask for: feature -> the flag that asked."""
    return {"resume": "--resume" if resume else "--rejoin" if rejoin else None,
            "checkpoint": ("--checkpoint-dir" if checkpoint_dir is not None
                           else "--checkpoint-every" if checkpoint_every != 1 else None),
            "asynchronous schedule": f"--schedule {schedule}" if schedule is not None else None,
            "fault tolerance": fault_tolerance, "trace": "--trace" if trace is not None else None,
            "metrics": "--metrics" if metrics is not None else None}


def _fault_tolerance_flag(*, replan, heartbeat, failure_timeout, probe_timeout, replicate_every) -> str | None:
    """The first fault-tolerance flag given a value of its own (a psl or inference plan refuses them;
    on a training plan, --profile with --replan light/heavy is what asks)."""
    defaults = (("--replan", replan, "light"), ("--heartbeat", heartbeat, 1.0),
                ("--failure-timeout", failure_timeout, 3.0), ("--probe-timeout", probe_timeout, 2.0),
                ("--replicate-every", replicate_every, 1))
    return next((flag for flag, value, default in defaults if value != default), None)


def _refuse_training_only(plan_file: Path, given: dict) -> None:
    """Flags only training plans use, on an inference plan (flag -> value, None when not given)."""
    for flag, value in given.items():
        if value is not None:
            raise BadInput(f"{flag}: only for training plans; {plan_file} is an inference (galaxy) plan")


def _refuse_inference_flags(plan_file: Path, kind: str, given: dict) -> None:
    """Flags only inference plans use, on a training plan: `--input-ids` was silently ignored (the run
    trained as if it had not been given). `given`: flag -> value, None when left at its default."""
    for flag, value in given.items():
        if value is not None:
            raise BadInput(f"{flag}: only for inference (galaxy) plans; {plan_file} is a {kind} training plan")


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
