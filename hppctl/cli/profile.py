"""`hppctl profile`: cluster inventory + model -> profile file (per-layer times on a batch grid).

`preset:` devices are modelled from published specifications (docs/presets.md); `host:` devices
are measured over SSH and `local:` devices in a subprocess (docs/profiling.md), in parallel, with
a progress bar per device on stderr, and then the links between them one pair at a time. A
cluster of presets only writes `"source": "preset"`, anything measured `"source": "measured"`.
A device that fails is named with the reason on stderr, listed in the profile's
`missing_devices`, and the command exits 1 after writing the others.

Output: `--out F` writes the profile atomically (.json/.yaml by extension) and prints a summary
(`--json`: the summary as one JSON document). Without `--out`, `--json` prints the profile
itself on stdout; with neither, the command refuses rather than guess a file name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from hppctl.cli.flags import INPUT_DTYPE_HELP, INPUT_SHAPE_HELP, positive, seconds, threads as check_threads
from hppctl.cli.flags import model_input as check_model_input
from hppctl.cli.output import emit_json, note, stderr, stdout, writable_path
from hppctl import driver
from hppctl.profiling.summary import failure_line, summarize
from hppctl.errors import BadInput, RuntimeFailure
from hppctl.models.cluster import ClusterSpec
from hppctl.models.profile import Profile
from hppctl.models.units import format_bytes

EXAMPLES = """
Examples:

\b
  hppctl profile --cluster profiles/env-c.yaml --model efficientnet-b1 --out out/env-c-efficientnet-b1.json
  hppctl profile --cluster examples/local.yaml --model tiny-cnn --out out/local.json     # measured: 3 local workers
  hppctl profile --cluster out/env-d.yaml --model mobilenetv2 --batch-sizes 1,2,4,8,16,32,64 --out out/env-d.json
  hppctl profile --cluster out/env-d.yaml --model mobilenetv2 --out out/env-d.json --force --repeats 9
  hppctl profile --cluster out/env-d.yaml --model tiny-cnn --install --out out/env-d-tiny.json
  hppctl profile --cluster profiles/env-b.yaml --model resnet50 --batch-sizes 1,2,4,8,16,32 --out out/b-r50.yaml
  hppctl profile --cluster profiles/example.yaml --model bert-small --granularity block --optimizer adam --json   # the profile on stdout
  hppctl profile --cluster profiles/example.yaml --model hf:./my-checkpoint --out out/mine.json
  hppctl profile --cluster examples/local.yaml --model examples.mynet:make --input-shape 3x32x32 --out out/mine.json

Without --out, --json prints the profile itself on stdout; give one of the two.
Measured devices are cached per batch size ($HPPCTL_CACHE_DIR or ~/.cache/hppctl): a rerun
measures only what is missing (--force: everything), and an interrupted run resumes.
"""

GRANULARITIES = ("fine", "block")
WORKDIR_PROFILE_HELP = ("Your code: a directory installed on every measured device over SSH (cached there by content "
                        "hash: unchanged, it is not sent again) and first on the probes' import path, for a model "
                        "of your own. Checked as `hppctl run --workdir` checks it. Default: none.")


def parse_batch_sizes(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (sorted, de-duplicated); `BadInput` naming the bad entry otherwise."""
    from hppctl.profiling.from_presets import validate_batch_sizes

    values = []
    for part in text.split(","):
        item = part.strip()
        try:
            value = int(item)
        except ValueError:
            raise BadInput(f"--batch-sizes: {item!r} is not a whole number (in {text!r}; "
                           f"expected a comma-separated list such as 1,2,4,8)") from None
        if value <= 0:
            raise BadInput(f"--batch-sizes: {value} is not a positive number of samples (in {text!r})")
        values.append(value)
    return validate_batch_sizes(values)


def _choice(flag: str, value: str, allowed) -> str:
    if value not in allowed:
        raise BadInput(f"{flag}: unknown value {value!r} (choose one of {', '.join(allowed)})")
    return value


def _check_out(out: Path) -> None:
    if out.suffix.lower() not in (".json", ".yaml", ".yml"):
        raise BadInput(f"--out: {out}: unknown file extension {out.suffix!r} (use .json, .yaml or .yml)")
    writable_path("--out", out)


def _check_probe_flags(repeats: int, warmup: int, threads: int | None, timeout: float, link_seconds: float,
                      num_layers: int | None) -> None:
    """Before the cluster is read: ProbeSettings refused only values below its minimums, so
    `--timeout nan`, `--threads 100000` or `--repeats 10**30` passed on a preset cluster and went
    to the devices on a measured one."""
    positive("--repeats", repeats)
    positive("--warmup", warmup, allow_zero=True)
    check_threads("--threads", threads)
    seconds("--timeout", timeout)
    seconds("--link-seconds", link_seconds, low=0.1, high=3600)  # shorter measures latency, not bandwidth
    positive("--layers", num_layers)


def profile_command(
    cluster: Annotated[Optional[Path], typer.Option("--cluster", help="Cluster inventory (.yaml/.json). Required.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="Built-in model (see `hppctl models`), hf:PATH, or package.module:factory (your own). Required.")] = None,
    granularity: Annotated[str, typer.Option("--granularity", help="Layer sequence: fine (modules) or block (residual/transformer blocks).")] = "fine",
    batch_sizes: Annotated[Optional[str], typer.Option("--batch-sizes", help="Comma-separated batch grid (default 1,2,4,...,256; measured devices stop at the largest that fits).")] = None,
    optimizer: Annotated[str, typer.Option("--optimizer", help="Sizes the optimizer state: sgd (0x params), momentum (1x), adam (2x).")] = "momentum",
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the profile here (.json or .yaml), atomically.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout: the summary with --out, else the profile itself.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Measure again even what the cache holds.")] = False,
    install: Annotated[bool, typer.Option("--install", help="Build this hppctl's wheel and install it into a venv on every host: device.")] = False,
    links: Annotated[bool, typer.Option("--links/--no-links", help="Measure the links between measured devices (else: the inventory's bandwidths).")] = True,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed passes per batch size on measured devices (medians over these).")] = 7,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed passes before them.")] = 2,
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch threads on measured devices, at most 1024 (default: ceil of each device's CPU quota).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds allowed for one device's measurement (1 to 2592000).")] = 3600.0,
    link_seconds: Annotated[float, typer.Option("--link-seconds", help="Seconds of each one-way link transfer (0.1 to 3600).")] = 2.0,
    seq_len: Annotated[Optional[str], typer.Option("--seq-len", help="Collaborative inference (Galaxy): profile attention by heads, MLP by columns and connective blocks by rows at these sequence lengths (e.g. 284 or 128,284); docs/galaxy.md.")] = None,
    num_layers: Annotated[Optional[int], typer.Option("--layers", help="With --seq-len: plan and run only the first K layers (a layer stack).")] = None,
    input_shape: Annotated[Optional[str], typer.Option("--input-shape", help=INPUT_SHAPE_HELP)] = None,
    input_dtype: Annotated[Optional[str], typer.Option("--input-dtype", help=INPUT_DTYPE_HELP)] = None,
    workdir: Annotated[Optional[Path], typer.Option("--workdir", help=WORKDIR_PROFILE_HELP)] = None,
) -> None:
    """Profile every device of a cluster for a model: per-layer forward/backward time on a batch grid, memory budgets and link bandwidths. Presets are modelled (docs/presets.md); host: and local: devices are measured (docs/profiling.md)."""
    from hppctl.profiling.from_presets import (DEFAULT_BATCH_SIZES, OPTIMIZER_STATE_FACTORS, build_preset_profile,
                                               preset_devices)
    from hppctl.store import load, save

    if cluster is None:
        raise BadInput("--cluster: required (a cluster inventory such as profiles/env-a.yaml)")
    if model is None:
        raise BadInput("--model: required (a built-in model from `hppctl models`, or hf:PATH)")
    _check_probe_flags(repeats, warmup, threads, timeout, link_seconds, num_layers)
    check_model_input(model, input_shape, input_dtype)
    if out is not None:  # before the cluster is read and any device measured, inference profiles too
        _check_out(out)
    from hppctl.runtime.workdir import open_workdir, user_code

    shipped = open_workdir(workdir)  # checked as `run` checks it; first on this process's import path
    if shipped is not None and seq_len is not None:
        raise BadInput("--workdir: not taken with --seq-len (inference profiles measure built-in and hf: models)")
    if seq_len is not None:  # collaborative inference (issue 8): its own profile kind
        from hppctl.zoo.user import refuse_inference
        refuse_inference(model)
        from hppctl.cli.galaxy import profile_inference
        return profile_inference(cluster, model, seq_len, layers=num_layers, out=out, as_json=as_json,
                                 repeats=repeats, warmup=warmup, threads=threads, timeout=timeout)
    _choice("--granularity", granularity, GRANULARITIES)
    _choice("--optimizer", optimizer, tuple(OPTIMIZER_STATE_FACTORS))
    grid = parse_batch_sizes(batch_sizes) if batch_sizes is not None else list(DEFAULT_BATCH_SIZES)
    if out is None and not as_json:
        raise BadInput("--out: give a file to write the profile to (e.g. --out out/profile.json), "
                       "or --json to print it on stdout")

    spec = load(cluster, ClusterSpec)
    preset_devices(spec, str(cluster))  # fail on a bad device before paying for the model
    from hppctl.runtime.accelerator import check_local_devices
    check_local_devices(spec, [d.name for d in spec.devices], "fp32", cluster_source=str(cluster))  # cuda here?
    from hppctl.profiling.cluster import ProbeSettings

    # checked even when every device is a preset (and the settings go unused): a typo must not pass
    settings = ProbeSettings(repeats=repeats, warmup=warmup, threads=threads, timeout_s=timeout,
                             link_seconds=link_seconds)
    layers, parts = driver.model_layers(model, granularity)
    if granularity != "fine" and parts is None:
        note(f"{model}: fine layers do not nest in the blocks; timing each block with the block-level model")
    measured = [d for d in spec.devices if d.preset is None]
    failures: dict[str, str] = {}
    cache_use: dict[str, dict[str, list[int]]] = {}
    workdir_summary = None
    if not measured:
        note(f"{model} ({granularity}): {len(layers)} layers x {len(spec.devices)} preset devices x {len(grid)} batch sizes")
        profile = build_preset_profile(spec, layers, model=model, granularity=granularity, batch_sizes=grid,
                                       optimizer_state_factor=OPTIMIZER_STATE_FACTORS[optimizer], parts=parts,
                                       source=str(cluster))
    else:
        note(f"{model} ({granularity}): {len(layers)} layers; measuring {len(measured)} of {len(spec.devices)} "
             f"devices at batch sizes {','.join(map(str, grid))}")
        code = user_code(shipped, model=model)
        run = measure(spec, model, granularity, grid, layers, settings, OPTIMIZER_STATE_FACTORS[optimizer],
                      force=force, install=install, links=links, source=str(cluster), user_code=driver.probe_code(code))
        profile, failures = run.profile, run.failures
        if code is not None:
            # bytes each device was sent (the summary's and run's line), in the cluster file's order
            code.sent = {d.name: run.workdir[d.name] for d in spec.devices if d.name in run.workdir}
            workdir_summary = code.summary()
            note(code.line())
        cache_use = {"measured": run.measured, "cached": run.cached}
        for text in run.notes:
            note(f"note: {text}")
        reused = {n: b for n, b in run.cached.items() if b}
        if reused:
            note("from the cache (--force measures again): " + "; ".join(
                f"{n} batch {','.join(map(str, b))}" for n, b in reused.items()))
        if profile is None:
            raise RuntimeFailure("no device could be profiled: " + "; ".join(f"{k}: {v}" for k, v in failures.items()))
    from hppctl.zoo.user import recorded_input
    profile = profile.model_copy(update={"model_input": recorded_input(model)})  # plan and run need no flags again
    warn_implausible_times(profile)
    if out is None:
        emit_json(profile.model_dump(mode="json"))
    else:
        save(out, profile)
        note(f"wrote {out}")
        summary = summarize(profile, out)
        summary["failures"] = failures
        summary.update(cache_use)
        if shipped is not None:
            summary["workdir"] = workdir_summary
        emit_json(summary) if as_json else _render(profile, summary)
    if failures:
        raise RuntimeFailure(failure_line(failures, out if profile.missing_devices else None))


def warn_implausible_times(profile: Profile) -> None:
    """One `warning:` line per device whose times are implausible (profiling/sanity.py)."""
    from hppctl.profiling.sanity import timing_warnings

    for line in timing_warnings(profile):
        note(f"warning: {line}")


def measure(spec: ClusterSpec, model: str, granularity: str, grid: list[int], layers, settings, optimizer_state_factor: float,
            *, force: bool, install: bool, links: bool, source: str, user_code=None):
    """`profile_cluster` with a rich progress bar per device on stderr; `user_code`: a `ProbeCode` (--workdir)."""
    from hppctl.profiling.cluster import profile_cluster

    try:
        with ProgressObserver([d.name for d in spec.devices if d.preset is None]) as observer:
            return profile_cluster(spec, model, granularity=granularity, batch_sizes=grid, layers=layers,
                                   optimizer_state_factor=optimizer_state_factor, settings=settings, force=force,
                                   install=install, measure_links=links, observer=observer, source=source,
                                   user_code=user_code)
    except KeyboardInterrupt:
        raise Interrupted("interrupted: the measurements made so far are cached; run the same command again "
                          "to resume") from None


class Interrupted(RuntimeFailure):
    """Ctrl-C during measurement (exit 130, as for any interrupted command)."""

    exit_code = 130


class ProgressObserver:
    """Draws one rich progress bar per measured device on stderr (profile_cluster's Observer)."""

    def __init__(self, names: list[str]) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.fields[device]:<12}"), BarColumn(bar_width=30),
                                 TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
                                 TextColumn("{task.fields[status]}"), console=stderr, transient=False)
        self.tasks = {n: self.progress.add_task("", total=1.0, device=n, status="waiting") for n in names}

    def __enter__(self) -> "ProgressObserver":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def device_phase(self, name: str, text: str, done: float | None = None, total: float | None = None) -> None:
        fields = {"status": text}
        if done is not None and total:
            fields["completed"] = min(1.0, done / total)
        self.progress.update(self.tasks[name], **fields)

    def device_done(self, name: str, text: str) -> None:
        self.progress.update(self.tasks[name], completed=1.0, status=f"done: {text}")

    def device_failed(self, name: str, reason: str) -> None:
        self.progress.update(self.tasks[name], status=f"[red]failed[/red]: {reason}")
        self.progress.console.print(f"{name}: failed: {reason}")

    def link(self, a: str, b: str, text: str) -> None:
        if text != "measuring":
            self.progress.console.print(f"link {a} <-> {b}: {text}")

    def note(self, text: str) -> None:
        self.progress.console.print(text)


def compute_label(device) -> str:
    """What runs a device's layers: measured devices on their CPU (hppctl measures with CPU torch), a
    preset on what the preset models ("cpu 845 GFLOP/s peak" was a Jetson's GPU)."""
    from hppctl.profiling.presets import PRESETS

    gpu = device.accelerator
    if gpu is not None:  # measured on its GPU (`accelerator:` in the cluster file)
        memory = f", {format_bytes(gpu.memory_bytes)}{' unified' if gpu.integrated else ''}" if gpu.memory_bytes else ""
        return f"{gpu.type.upper()} {gpu.name or ''}{memory}".replace("  ", " ")
    if device.measurement is not None:
        quota = device.measurement.cpu_quota_cores
        share = f"{quota:.2f} cores" if quota else f"{device.measurement.cpus} cores"
        threads = device.measurement.threads
        return f"CPU ({share}, {threads} thread{'s' * (threads != 1)})"
    preset = PRESETS.get(device.kind)
    if preset is not None:
        return preset.compute_label
    return f"{device.peak_flops / 1e9:.0f} GFLOP/s peak" if device.peak_flops else "-"


def _render(profile: Profile, summary: dict) -> None:
    stdout.print(f"{profile.model} ({profile.granularity}, {len(profile.layers)} layers, "
                 f"{format_bytes(summary['parameters_bytes'])} of parameters, "
                 f"{summary['forward_flops_per_sample'] / 1e6:.1f} MFLOP forward per sample) on {profile.cluster}, "
                 f"source: {profile.source}")
    grid = sorted({b for d in profile.devices for b in d.batch_sizes})
    shown = sorted({grid[0], grid[len(grid) // 2], grid[-1]})
    table = Table(box=None, pad_edge=False)
    for col in ("device", "kind", "memory budget", "computes on", *[f"train ms/sample @{b}" for b in shown]):
        table.add_column(col)
    for d, entry in zip(profile.devices, summary["devices"]):
        per_sample = entry["train_s_per_sample"]
        table.add_row(d.name, d.kind, format_bytes(d.memory_bytes), compute_label(d),
                      *[f"{per_sample[str(b)] * 1e3:.3f}" if str(b) in per_sample else "-" for b in shown])
    stdout.print(table)
    measured = [l for l in profile.links if l.source == "measured"]
    if measured:
        links = Table(box=None, pad_edge=False)
        for col in ("link", "a->b", "b->a", "rtt"):
            links.add_column(col)
        for l in measured:
            ab, ba = l.directed_bytes_per_s or [l.bytes_per_s, l.bytes_per_s]
            rtt = f"{l.rtt_s * 1e3:.2f} ms" if l.rtt_s is not None else "-"
            links.add_row(f"{l.between[0]} <-> {l.between[1]}", _mbit(ab), _mbit(ba), rtt)
        stdout.print(links)
    for m in profile.missing_devices:
        stdout.print(f"missing: {m.name}: {m.reason}")


def _mbit(bytes_per_s: float) -> str:
    return f"{bytes_per_s * 8 / 1e6:.1f} Mbit/s"


def register(app: typer.Typer) -> None:
    app.command("profile", help=(profile_command.__doc__ or "") + "\n" + EXAMPLES)(profile_command)
