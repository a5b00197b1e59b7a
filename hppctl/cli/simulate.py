"""`hppctl simulate`: replay a plan's schedule in discrete events; timeline, memory, what-ifs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from hppctl.cli.flags import MAX_SECONDS, MIN_PERIOD_S, positive, seconds
from hppctl.cli.output import emit_json, note, stdout, writable_path
from hppctl.errors import BadInput
from hppctl.models.plan import HppPlan
from hppctl.models.profile import Profile
from hppctl.models.units import MAX_DURATION, format_bytes
from hppctl.store import load, save, write_text_atomic

EXAMPLES = """
Examples (from the repository root; files in examples/ and profiles/, outputs under out/):

\b
  hppctl simulate --plan plans/example-tiny.yaml --profile profiles/example-tiny.json
  hppctl simulate --plan plans/example-tiny.yaml --trace out/trace.json                  # open in ui.perfetto.dev
  hppctl simulate --plan plans/example-tiny.yaml --png out/timeline.png                  # needs 'hppctl[plot]'
  hppctl simulate --plan plans/example-tiny.yaml --policy gpipe --json                   # what-if: another schedule
  hppctl simulate --plan plans/example-tiny.yaml --warmup 2,1 --write-schedule out/s.json  # in flight per stage
  hppctl simulate --plan plans/example-tiny.yaml --schedule out/s.json --blocking        # replay a schedule file
  hppctl simulate --plan plans/example-tiny.yaml --profile profiles/example-tiny.json --fail pi0@30   # recovery what-if
"""


def simulate_command(
    plan_file: Annotated[Path, typer.Option("--plan", help="Plan file (.json/.yaml) from `hppctl plan`.")],
    profile_file: Annotated[Optional[Path], typer.Option("--profile", help="Profile the plan was made from: per-device, per-layer timings and memory (recommended).")] = None,
    policy: Annotated[Optional[str], typer.Option("--policy", help="Schedule instead of the plan's: 1f1b-asteroid, 1f1b, gpipe, 2(P-p), 2(P-p)+1.")] = None,
    warmup: Annotated[Optional[str], typer.Option("--warmup", help="Micro-batches each stage forwards before its first backward (its most in flight), e.g. 5,3,1.")] = None,
    schedule_file: Annotated[Optional[Path], typer.Option("--schedule", help="Replay this schedule file (checked first) instead of generating one.")] = None,
    write_schedule: Annotated[Optional[Path], typer.Option("--write-schedule", help="Write the (generated) schedule here (.json/.yaml).")] = None,
    show_schedule: Annotated[bool, typer.Option("--show-schedule", help="Print every device's actions in text form.")] = False,
    blocking: Annotated[bool, typer.Option("--blocking", help="Blocking (rendezvous) send/recv instead of async isend + pre-posted irecv.")] = False,
    step_time: Annotated[float, typer.Option("--step-time", help="Seconds of one optimizer step per device (the profile has none; default 0, at most 86400).")] = 0.0,
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Write Chrome trace events (.json) for Perfetto / chrome://tracing.")] = None,
    png: Annotated[Optional[Path], typer.Option("--png", help="Render the timeline to a PNG (needs matplotlib: pip install 'hppctl[plot]').")] = None,
    fail: Annotated[Optional[str], typer.Option("--fail", help="DEVICE@SECONDS: predict recovery from this device failing at this time (needs --profile); DEVICE,DEVICE@SECONDS: several failing together.")] = None,
    replan: Annotated[str, typer.Option("--replan", help="With --fail: light, heavy or both (side by side).")] = "both",
    timeout: Annotated[float, typer.Option("--timeout", help="With --fail: heartbeat silence before a device is suspect (s; 0.01 to 2592000).")] = 3.0,
    replicate_every: Annotated[int, typer.Option("--replicate-every", help="With --fail: rounds between backups, as `hppctl run --replicate-every` (0: none).")] = 1,
    fail_kind: Annotated[str, typer.Option("--fail-kind", help="With --fail: silent (hung, unreachable, powered off: found by heartbeat timeout and probe) or crash (the worker process dies: seen at once).")] = "silent",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Simulate one training round of a plan: latency, throughput, per-device busy/bubble and peak memory."""
    from hppctl.planner.explain import check_plan_matches
    from hppctl.schedule import PlanTimings, ProfileTimings, check_schedule, schedule_for_plan, simulate
    from hppctl.schedule.simulate import check_schedule_matches, result_document
    from hppctl.models.schedule import Schedule

    if fail is not None:
        _simulate_failure(plan_file, profile_file, fail, replan, timeout, replicate_every, fail_kind, as_json)
        return
    seconds("--step-time", step_time, low=0.0, high=MAX_DURATION)
    for flag, path in (("--write-schedule", write_schedule), ("--trace", trace), ("--png", png)):
        writable_path(flag, path)  # before the work: --png '' or a folder ended in an OSError traceback
    if png is not None:
        from hppctl.schedule.render import require_matplotlib
        require_matplotlib()  # before --trace or --write-schedule is written: nothing half-done
    if sum(x is not None for x in (policy, warmup, schedule_file)) > 1:
        raise BadInput("--policy, --warmup and --schedule are alternatives: give at most one")
    plan = load(plan_file, HppPlan)
    profile = None
    if profile_file is not None:
        profile = load(profile_file, Profile)
        check_plan_matches(plan, profile, str(plan_file), str(profile_file))
    if schedule_file is not None:
        schedule = load(schedule_file, Schedule)
        check_schedule_matches(schedule, plan, str(schedule_file))
    else:
        try:
            schedule = schedule_for_plan(plan, policy, _parse_warmup(warmup) if warmup else None)
        except ValueError as e:
            # the flag that chose the schedule, or the plan itself when no flag did
            culprit = "--warmup" if warmup else "--policy" if policy else str(plan_file)
            raise BadInput(f"{culprit}: {e}") from None
    check_schedule(schedule)
    if write_schedule is not None:
        save(write_schedule, schedule)
        note(f"wrote {write_schedule}")
    timings = ProfileTimings(profile, schedule, step_s=step_time) if profile else PlanTimings(plan, step_s=step_time)
    result = simulate(schedule, timings, mode="blocking" if blocking else "async", trace=bool(trace or png))
    if trace is not None:
        from hppctl.schedule.trace import chrome_trace
        write_text_atomic(trace, json.dumps(chrome_trace(result, schedule, title=str(plan_file))))
        note(f"wrote {trace} (open in https://ui.perfetto.dev)")
    if png is not None:
        from hppctl.schedule.render import render_png
        render_png(result, schedule, png)
        note(f"wrote {png}")
    if as_json:
        emit_json(result_document(plan, schedule, result, with_profile=profile is not None))
        return
    if show_schedule:
        for device, actions in schedule.actions.items():
            stdout.print(f"{device}: " + " ".join(str(a) for a in actions), soft_wrap=True)
    _render(plan, schedule, result, profile is not None)


def _simulate_failure(plan_file, profile_file, fail: str, replan: str, timeout: float, replicate_every: int,
                      kind: str, as_json: bool) -> None:
    from hppctl.planner.explain import check_plan_matches
    from hppctl.schedule.failure import FAILURE_KINDS, simulate_failure

    named, _, when = fail.rpartition("@")
    devices = named.split(",")
    try:
        at_s = float(when)
    except ValueError:
        raise BadInput(f"--fail: expected DEVICE@SECONDS like nano1@30 (or nano1,nano2@30), got {fail!r}") from None
    if not 0 <= at_s <= MAX_SECONDS:  # also refuses nan
        raise BadInput(f"--fail: SECONDS must be from 0 to {MAX_SECONDS:.0f}, got {fail!r}")
    if replan not in ("light", "heavy", "both"):
        raise BadInput(f"--replan: expected light, heavy or both, got {replan!r}")
    seconds("--timeout", timeout, low=MIN_PERIOD_S)
    positive("--replicate-every", replicate_every, allow_zero=True)  # 0: no backups
    if kind not in FAILURE_KINDS:
        raise BadInput(f"--fail-kind: expected {' or '.join(FAILURE_KINDS)}, got {kind!r}")
    if profile_file is None:
        raise BadInput("--fail: needs --profile (re-planning uses the per-layer timings)")
    plan, profile = load(plan_file, HppPlan), load(profile_file, Profile)
    check_plan_matches(plan, profile, str(plan_file), str(profile_file))
    for device in devices:
        if device not in plan.devices():
            raise BadInput(f"--fail: device {device!r} is not in the plan (devices: {', '.join(plan.devices())})")
        if devices.count(device) > 1:
            raise BadInput(f"--fail: device {device!r} is named twice in {fail!r}")
    methods = ["light", "heavy"] if replan == "both" else [replan]
    runs = [simulate_failure(plan, profile, devices, at_s, method=m, timeout_s=timeout, replicate_every=replicate_every,
                             kind=kind) for m in methods]
    if as_json:
        emit_json([{**r.__dict__, "detection_s": r.detection_s, "recovery_s": r.recovery_s} for r in runs])
        return
    table = Table(box=None, pad_edge=False, title=f"{', '.join(devices)} fail{'s' * (len(devices) == 1)} ({kind}) "
                                                  f"at {at_s:g} s")
    for col in ("re-planning", "detected s", "replan s", "moved", "move s", "first round done s", "recovery s",
                "samples/s before", "samples/s after", "stages after"):
        table.add_column(col)
    for r in runs:
        label = r.method if r.method == r.requested else f"{r.requested} -> {r.method} (memory)"
        table.add_row(label, f"{r.detected_at_s:.2f}", f"{r.replan_s:.3f}", format_bytes(r.moved_bytes),
                      f"{r.move_s:.2f}", f"{r.first_round_done_at_s:.2f}", f"{r.recovery_s:.2f}",
                      f"{r.throughput_before:.1f}", f"{r.throughput_after:.1f}", str(r.stages_after))
    stdout.print(table)
    stdout.print(_backup_cost(plan, profile, replicate_every, runs[0].throughput_before), soft_wrap=True)


def _backup_cost(plan: HppPlan, profile: Profile, replicate_every: int, with_backups: float) -> str:
    """Why "samples/s before" is not `hppctl simulate`'s figure for the same plan: rounds that can
    recover carry backups on the same uplinks as the activations (schedule/failure.py)."""
    from hppctl.schedule import simulate_plan
    from hppctl.schedule.failure import backups

    plain = simulate_plan(plan, profile)[1].throughput_samples_per_s
    sent = backups(plan, profile) if replicate_every > 0 else []
    if not sent:
        why = "no backups (--replicate-every 0)" if replicate_every <= 0 else "no backups (every stage is replicated)"
        return f"samples/s before: {with_backups:.1f}, as `hppctl simulate` reports: {why}"
    every = "every round" if replicate_every == 1 else f"every {replicate_every} rounds"
    listed = ", ".join(f"{b.sender} -> {b.holder} {format_bytes(b.bytes)}" for b in sent)
    return (f"samples/s before and after count the backups that make recovery possible: {format_bytes(sum(b.bytes for b in sent))} "
            f"of weights and optimizer state {every} ({listed}) on the links the activations use; without them the "
            f"plan runs at {plain:.1f} samples/s (`hppctl simulate`), with them {with_backups:.1f} "
            f"(--replicate-every sets how often)")


def _parse_warmup(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise BadInput(f"--warmup: expected comma-separated positive integers like 5,3,1, got {text!r}") from None
    if any(v < 1 for v in values):
        raise BadInput(f"--warmup: every stage needs at least 1 micro-batch in flight, got {text!r}")
    return values


def _render(plan: HppPlan, schedule, result, with_profile: bool) -> None:
    split = " with split backwards" if plan.split_backward else ""
    stdout.print(f"{plan.strategy} plan for {plan.model}: {len(plan.stages)} stages, schedule {schedule.policy}{split}, "
                 f"{result.mode} transfers, timings from the {'profile' if with_profile else 'plan (no --profile)'}")
    if schedule.micro_batches_per_update is None:
        _render_round(plan, result)
    else:  # nf1b, pipedream (docs/timeprest.md)
        _render_async_window(plan, schedule, result)


def _render_table(result) -> None:
    table = Table(box=None, pad_edge=False)
    for col in ("stage", "device", "samples", "compute s", "busy", "idle", "all-reduce s", "in flight",
                "peak activations", "peak memory of budget"):
        table.add_column(col)
    for d in result.devices:
        memory = (f"{format_bytes(d.peak_memory_bytes)} of {format_bytes(d.budget_bytes)}"
                  if d.peak_memory_bytes is not None and d.budget_bytes else "-")
        table.add_row(str(d.stage), d.device, str(d.samples), f"{d.compute_s:.3f}", f"{result.busy_fraction(d):.0%}",
                      f"{result.bubble_fraction(d):.0%}", f"{d.allreduce_s:.3f}", str(d.peak_in_flight_micro_batches),
                      format_bytes(d.peak_activation_bytes) if d.peak_activation_bytes is not None else "-", memory)
    stdout.print(table)
    busiest = sorted(result.links, key=lambda link: -link.busy_s)[:8]
    if busiest and result.round_latency_s > 0:  # a hand-written plan without timings simulates to 0 s
        stdout.print("busiest links: " + ", ".join(
            f"{link.src}->{link.dst} {format_bytes(link.bytes)} in {link.busy_s:.3f} s "
            f"({link.busy_s / result.round_latency_s:.0%})" for link in busiest))


def _render_round(plan: HppPlan, result) -> None:
    est = plan.prediction.round_latency_s
    error = (est - result.round_latency_s) / result.round_latency_s if result.round_latency_s else 0.0
    stdout.print(f"simulated round latency {result.round_latency_s:.3f} s, throughput "
                 f"{result.throughput_samples_per_s:.1f} samples/s; planner's estimate {est:.3f} s ({error:+.1%})")
    _render_table(result)


def _against_synchronous(throughput: float, plan: HppPlan) -> str:
    sync = plan.prediction.throughput_samples_per_s
    if sync <= 0 or throughput <= 0:  # a hand-written plan without timings
        return ""
    ratio = throughput / sync - 1
    side = "above" if ratio >= 0 else "below"
    return f", {abs(ratio):.0%} {side} the {sync:.1f} samples/s the planner estimates for the plan's synchronous rounds"


def _render_async_window(plan: HppPlan, schedule, result) -> None:
    """An asynchronous window is many mini-batches, the plan's estimate one synchronous round: their
    latencies do not compare (it printed "estimate 0.004 s (-91.7%)"); throughputs do."""
    from hppctl.schedule.async_version import describe_version_report, plan_version_report

    N = schedule.micro_batches_per_update
    mini_batches = schedule.num_micro_batches // N
    stdout.print(f"simulated window of {mini_batches} mini-batches ({N} micro-batch{'es' * (N != 1)} x "
                 f"{schedule.micro_batch} samples each): {result.round_latency_s:.3f} s, throughput {result.throughput_samples_per_s:.1f} "
                 f"samples/s{_against_synchronous(result.throughput_samples_per_s, plan)}", soft_wrap=True)
    report = plan_version_report(len(plan.stages), N)
    if schedule.policy == "nf1b" and report:  # v is nf1b's (pipedream stashes the forward's weights)
        stdout.print(describe_version_report(report), soft_wrap=True)
    stdout.print("weight copies held per device: " + ", ".join(f"{d.device} {d.weight_versions}" for d in result.devices))
    _render_table(result)


def register(app: typer.Typer) -> None:
    app.command("simulate", help=(simulate_command.__doc__ or "") + "\n" + EXAMPLES)(simulate_command)
