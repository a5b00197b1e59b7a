"""`hppctl profile`: cluster inventory + model -> profile file (per-layer times on a batch grid).

Today every device must be a `preset:` (modelled from published specifications, docs/presets.md);
measuring `host:`/`local:` devices is a later issue and will write the same format.

Output: `--out F` writes the profile atomically (.json/.yaml by extension) and prints a summary
(`--json`: the summary as one JSON document). Without `--out`, `--json` prints the profile
itself on stdout; with neither, the command refuses rather than guess a file name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from hppctl.cli.output import emit_json, note, stdout
from hppctl.errors import BadInput, RuntimeFailure
from hppctl.models.cluster import ClusterSpec
from hppctl.models.profile import Profile
from hppctl.models.units import format_bytes

EXAMPLES = """
Examples:

\b
  hppctl profile --cluster profiles/env-c.yaml --model efficientnet-b1 --out out/env-c-efficientnet-b1.json
  hppctl profile --cluster profiles/env-b.yaml --model resnet50 --batch-sizes 1,2,4,8,16,32 --out out/b-r50.yaml
  hppctl profile --cluster profiles/example.yaml --model bert-small --granularity block --optimizer adam --json > p.json
  hppctl profile --cluster profiles/example.yaml --model hf:./my-checkpoint --out out/mine.json

Without --out, --json prints the profile itself on stdout; give one of the two.
"""

GRANULARITIES = ("fine", "block")


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
    if out.exists() and out.is_dir():
        raise BadInput(f"--out: {out} is a directory")


def model_layers(model: str, granularity: str):
    """The model's layer sequence from the zoo (built-in name or `hf:PATH`), and for `block` the fine
    layers each block is made of (None if they do not nest), so that a block is timed as its kernels."""
    try:
        from hppctl.zoo import layer_costs
    except ImportError:
        raise RuntimeFailure("the model zoo (hppctl.zoo.layer_costs) is not available in this build") from None
    from hppctl.profiling.from_presets import group_layers

    layers = layer_costs(model, granularity)
    if granularity == "fine":
        return layers, None
    parts = group_layers(layers, layer_costs(model, "fine"))
    if parts is None:
        note(f"{model}: fine layers do not nest in the blocks; timing each block with the block-level model")
    return layers, parts


def profile_command(
    cluster: Annotated[Optional[Path], typer.Option("--cluster", help="Cluster inventory (.yaml/.json). Required.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="Built-in model (see `hppctl models`) or hf:PATH. Required.")] = None,
    granularity: Annotated[str, typer.Option("--granularity", help="Layer sequence: fine (modules) or block (residual/transformer blocks).")] = "fine",
    batch_sizes: Annotated[Optional[str], typer.Option("--batch-sizes", help="Comma-separated batch grid (default 1,2,4,...,256).")] = None,
    optimizer: Annotated[str, typer.Option("--optimizer", help="Sizes the optimizer state: sgd (0x params), momentum (1x), adam (2x).")] = "momentum",
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the profile here (.json or .yaml), atomically.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout: the summary with --out, else the profile itself.")] = False,
) -> None:
    """Profile every device of a cluster for a model: per-layer forward/backward time on a batch grid, memory budgets and link bandwidths. Devices must be presets for now (docs/presets.md)."""
    from hppctl.profiling.from_presets import DEFAULT_BATCH_SIZES, OPTIMIZER_STATE_FACTORS, build_preset_profile, resolve_presets
    from hppctl.store import load, save

    if cluster is None:
        raise BadInput("--cluster: required (a cluster inventory such as profiles/env-a.yaml)")
    if model is None:
        raise BadInput("--model: required (a built-in model from `hppctl models`, or hf:PATH)")
    _choice("--granularity", granularity, GRANULARITIES)
    _choice("--optimizer", optimizer, tuple(OPTIMIZER_STATE_FACTORS))
    grid = parse_batch_sizes(batch_sizes) if batch_sizes is not None else list(DEFAULT_BATCH_SIZES)
    if out is not None:
        _check_out(out)
    elif not as_json:
        raise BadInput("--out: give a file to write the profile to (e.g. --out out/profile.json), "
                       "or --json to print it on stdout")

    spec = load(cluster, ClusterSpec)
    resolve_presets(spec, str(cluster))  # fail on a bad device before paying for the model
    layers, parts = model_layers(model, granularity)
    note(f"{model} ({granularity}): {len(layers)} layers x {len(spec.devices)} preset devices x {len(grid)} batch sizes")
    profile = build_preset_profile(spec, layers, model=model, granularity=granularity, batch_sizes=grid,
                                   optimizer_state_factor=OPTIMIZER_STATE_FACTORS[optimizer], parts=parts,
                                   source=str(cluster))
    if out is None:
        emit_json(profile.model_dump(mode="json"))
        return
    save(out, profile)
    note(f"wrote {out}")
    summary = summarize(profile, out)
    emit_json(summary) if as_json else _render(profile, summary)


def _per_sample_train_s(profile: Profile, device_index: int, batch_index: int) -> float:
    d = profile.devices[device_index]
    b = d.batch_sizes[batch_index]
    return sum(f[batch_index] + bw[batch_index] for f, bw in zip(d.forward_s, d.backward_s)) / b


def summarize(profile: Profile, out: Path | None) -> dict:
    """What `--json` prints after writing: where, what, and each device's training speed."""
    devices = []
    for i, d in enumerate(profile.devices):
        devices.append({
            "name": d.name, "kind": d.kind, "memory_bytes": d.memory_bytes, "peak_flops": d.peak_flops,
            "train_s_per_sample": {str(b): _per_sample_train_s(profile, i, j) for j, b in enumerate(d.batch_sizes)},
        })
    return {
        "out": str(out) if out is not None else None, "source": profile.source, "cluster": profile.cluster,
        "model": profile.model, "granularity": profile.granularity, "layers": len(profile.layers),
        "parameters_bytes": sum(l.param_bytes for l in profile.layers),
        "forward_flops_per_sample": sum(l.forward_flops_per_sample for l in profile.layers),
        "batch_sizes": profile.devices[0].batch_sizes, "optimizer_state_factor": profile.optimizer_state_factor,
        "default_bytes_per_s": profile.default_bytes_per_s,
        "links": [{"between": l.between, "bytes_per_s": l.bytes_per_s} for l in profile.links],
        "digest": profile.digest(), "devices": devices,
    }


def _render(profile: Profile, summary: dict) -> None:
    stdout.print(f"{profile.model} ({profile.granularity}, {len(profile.layers)} layers, "
                 f"{format_bytes(summary['parameters_bytes'])} of parameters, "
                 f"{summary['forward_flops_per_sample'] / 1e6:.1f} MFLOP forward per sample) on {profile.cluster}, "
                 f"source: {profile.source}")
    grid = profile.devices[0].batch_sizes
    shown = sorted({grid[0], grid[len(grid) // 2], grid[-1]})
    table = Table(box=None, pad_edge=False)
    for col in ("device", "preset", "memory budget", "peak FP32", *[f"train ms/sample @{b}" for b in shown]):
        table.add_column(col)
    for d in summary["devices"]:
        peak = f"{d['peak_flops'] / 1e9:.0f} GFLOP/s" if d["peak_flops"] else "-"
        table.add_row(d["name"], d["kind"], format_bytes(d["memory_bytes"]), peak,
                      *[f"{d['train_s_per_sample'][str(b)] * 1e3:.3f}" for b in shown])
    stdout.print(table)


def register(app: typer.Typer) -> None:
    app.command("profile", help=(profile_command.__doc__ or "") + "\n" + EXAMPLES)(profile_command)
