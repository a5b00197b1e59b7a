"""`hppctl models`: the built-in models, or the layer table of one model."""

from __future__ import annotations

from typing import Optional

import typer

from hppctl.cli.flags import INPUT_DTYPE_HELP, INPUT_SHAPE_HELP, model_input as check_model_input
from hppctl.cli.output import emit_json, stdout

HELP = """List the built-in models: name, task, parameters, layer counts, per-sample input.

With a MODEL (a built-in name, hf:PATH of a local Hugging Face checkpoint, or package.module:factory
of your own, imported from the current directory), print its layer sequence instead: per-sample
boundary and activation bytes, parameter bytes and forward FLOPs.

Examples:

\b
  hppctl models
  hppctl models --json
  hppctl models resnet50 --granularity block
  hppctl models hf:./my-bert --json             # a Hugging Face checkpoint directory of your own
  hppctl models examples.mynet:make --input-shape 3x32x32 -g block   # your own torch module (docs/zoo.md)
"""


def _count(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f}"


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _list(as_json: bool) -> None:
    from rich.table import Table

    from hppctl.zoo import list_models

    infos = list_models()
    if as_json:
        emit_json(
            [
                {
                    "name": i.name,
                    "task": i.task,
                    "parameters": i.parameters,
                    "layers": {"fine": i.layers.fine, "block": i.layers.block},
                    "input": list(i.input),
                }
                for i in infos
            ]
        )
        return
    table = Table(title="built-in models", title_justify="left")
    for column, justify in (("name", "left"), ("task", "left"), ("parameters", "right"), ("fine layers", "right"),
                            ("blocks", "right"), ("input", "left"), ("description", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for i in infos:
        table.add_row(i.name, i.task, _count(i.parameters), str(i.layers.fine), str(i.layers.block),
                      "×".join(map(str, i.input)), i.description)
    stdout.print(table)


def _layers(name: str, granularity: str, as_json: bool) -> None:
    from rich.table import Table

    from hppctl.zoo import layer_costs, model_info

    info = model_info(name)
    costs = layer_costs(name, granularity)
    if as_json:
        emit_json({"model": info.name, "granularity": granularity, "layers": [c.model_dump(mode="json") for c in costs]})
        return
    table = Table(
        title=f"{info.name}: {len(costs)} layers at {granularity} granularity (per sample, fp32)", title_justify="left"
    )
    for column, justify in (("#", "right"), ("name", "left"), ("kind", "left"), ("sent if cut after", "right"),
                            ("kept for backward", "right"), ("parameters", "right"), ("forward FLOPs", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for index, c in enumerate(costs):
        table.add_row(str(index), c.name, c.kind, _bytes(c.boundary_bytes_per_sample), _bytes(c.activation_bytes_per_sample),
                      _bytes(c.param_bytes), _count(c.forward_flops_per_sample))
    stdout.print(table)


def register(app: typer.Typer) -> None:
    @app.command("models", help=HELP)
    def models(
        model: Optional[str] = typer.Argument(None, help="Show this model's layer sequence (name or hf:PATH)."),  # noqa: UP007
        granularity: str = typer.Option("fine", "--granularity", "-g", help="Layer granularity: fine or block."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
        input_shape: Optional[str] = typer.Option(None, "--input-shape", help=INPUT_SHAPE_HELP),  # noqa: UP007
        input_dtype: Optional[str] = typer.Option(None, "--input-dtype", help=INPUT_DTYPE_HELP),  # noqa: UP007
    ) -> None:
        check_model_input(model, input_shape, input_dtype)
        if model is None:
            _list(as_json)
        else:
            _layers(model, granularity, as_json)
