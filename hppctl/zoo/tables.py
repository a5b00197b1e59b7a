"""Compute layer tables (torch side) and regenerate the shipped table.

    python -m hppctl.zoo.tables            # every built-in model -> hppctl/data/zoo_layers.json
    python -m hppctl.zoo.tables tiny-cnn   # print one model's tables
"""

from __future__ import annotations

import sys
import time
from typing import Any

from hppctl.zoo.catalog import BUILTINS, ModelSpec, get_model
from hppctl.zoo.layers import GRANULARITIES, TracedModel


def compute_entry(spec: ModelSpec, traced: TracedModel | None = None) -> dict[str, Any]:
    """Trace `spec` on the meta device (no weights are allocated) and cost both granularities."""
    traced = traced or TracedModel(spec, spec.trace_mode)
    refused = {"fine": traced.fine_refusal} if traced.fine_refusal is not None else {}
    layers = {g: [] if g in refused else [c.model_dump(mode="json") for c in traced.layer_costs(g)]
              for g in GRANULARITIES}
    info = {
        "name": spec.name,
        "task": spec.task,
        "family": spec.family,
        "parameters": traced.parameter_count(),
        "layers": {g: len(layers[g]) for g in GRANULARITIES},
        "input": list(spec.input_shape),
        "input_dtype": spec.input_dtype,
        "description": spec.description,
    }
    entry = {"fingerprint": spec.fingerprint(), "info": info, "layers": layers}
    if refused:  # a user model traced to its blocks only: why each refused granularity is refused
        entry["refused"] = refused
    return entry


def versions() -> dict[str, str]:
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def regenerate(names: list[str] | None = None) -> dict[str, Any]:
    from hppctl.zoo.cache import write_shipped

    models = {}
    for name in names or list(BUILTINS):
        start = time.perf_counter()
        models[name] = compute_entry(BUILTINS[name])
        counts = models[name]["info"]["layers"]
        print(f"{name}: fine {counts['fine']}, block {counts['block']} ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    write_shipped(models, versions())
    return models


def main(argv: list[str]) -> int:
    if not argv:
        regenerate()
        return 0
    from hppctl.zoo.cache import dumps_table

    for name in argv:
        print(dumps_table(compute_entry(get_model(name))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
