"""The catalog and the shipped layer table: pure data, no torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hppctl.errors import BadInput, UnknownModel
from hppctl.zoo import BUILTINS, get_model, layer_costs, list_models
from hppctl.zoo.cache import SHIPPED_TABLE
from tests.zoo.conftest import needs_table_transformers, shipped_table_version

PAPER_MODELS = {
    "mobilenetv2": "train",
    "efficientnet-b1": "train",
    "resnet50": "train",
    "bert-small": "train",
    "distilbert": "inference",
    "bert-large": "inference",
    "gpt2-large": "inference",
    "opt-1.3b": "inference",
    "opt-2.7b": "inference",
}


def test_every_paper_model_is_built_in_with_its_task():
    infos = {i.name: i for i in list_models()}
    for name, task in PAPER_MODELS.items():
        assert infos[name].task == task
    assert {"tiny-mlp", "tiny-cnn", "tiny-bert"} <= set(infos)


def test_inputs_and_parameter_counts():
    infos = {i.name: i for i in list_models()}
    assert infos["mobilenetv2"].input == [3, 32, 32]
    assert infos["efficientnet-b1"].input == [3, 32, 32]
    assert infos["resnet50"].input == [3, 224, 224]
    assert infos["bert-small"].input == [32]
    # Galaxy Table I (derived in notes/galaxy.md): 66 M, 334 M, 774 M, 1316 M, 2652 M.
    assert round(infos["distilbert"].parameters / 1e6) == 67
    assert round(infos["bert-large"].parameters / 1e6) == 335
    assert round(infos["gpt2-large"].parameters / 1e6) == 774
    assert round(infos["opt-1.3b"].parameters / 1e6) == 1316
    assert round(infos["opt-2.7b"].parameters / 1e6) == 2652
    assert round(infos["resnet50"].parameters / 1e6, 1) == 23.7  # 100 classes


def test_layer_counts_per_granularity():
    infos = {i.name: i for i in list_models()}
    assert infos["efficientnet-b1"].layers.fine >= 150  # the paper counts 213
    for info in infos.values():
        assert info.layers.block < info.layers.fine
        assert len(layer_costs(info.name, "fine")) == info.layers.fine
        assert len(layer_costs(info.name, "block")) == info.layers.block
    # block = stem + blocks + head
    assert infos["resnet50"].layers.block == 1 + 16 + 1
    assert infos["mobilenetv2"].layers.block == 1 + 16 + 1
    assert infos["bert-small"].layers.block == 1 + 4 + 1
    assert infos["bert-large"].layers.block == 1 + 24 + 1
    assert infos["gpt2-large"].layers.block == 1 + 36 + 1
    assert infos["opt-2.7b"].layers.block == 1 + 32 + 1


@pytest.mark.parametrize("name", list(BUILTINS))
@pytest.mark.parametrize("granularity", ["fine", "block"])
def test_param_bytes_sum_to_four_bytes_per_parameter(name, granularity):
    info = {i.name: i for i in list_models()}[name]
    assert sum(c.param_bytes for c in layer_costs(name, granularity)) == 4 * info.parameters


def test_granularities_cost_the_same_nodes():
    """Both granularities partition the same graph: totals agree, the model output ends both."""
    for name in BUILTINS:
        fine, block = layer_costs(name, "fine"), layer_costs(name, "block")
        for field in ("forward_flops_per_sample", "activation_bytes_per_sample", "param_bytes"):
            assert sum(getattr(c, field) for c in fine) == sum(getattr(c, field) for c in block), (name, field)
        assert fine[-1].boundary_bytes_per_sample == block[-1].boundary_bytes_per_sample


def test_each_block_is_a_run_of_fine_layers_with_the_same_totals():
    """Profilers time a block as the sum of its fine layers: sums and the closing cut must agree."""
    for name in BUILTINS:
        fine = iter(layer_costs(name, "fine"))
        for block in layer_costs(name, "block"):
            flops = params = activations = 0
            for layer in fine:
                flops += layer.forward_flops_per_sample
                params += layer.param_bytes
                activations += layer.activation_bytes_per_sample
                if flops >= block.forward_flops_per_sample and layer.boundary_bytes_per_sample == block.boundary_bytes_per_sample:
                    break
            assert (flops, params, activations) == (
                block.forward_flops_per_sample, block.param_bytes, block.activation_bytes_per_sample
            ), (name, block.name)
        assert next(fine, None) is None


def test_unknown_model():
    with pytest.raises(UnknownModel, match=r"unknown model 'nope' \(known: mobilenetv2, .*tiny-bert"):
        get_model("nope")
    with pytest.raises(UnknownModel):
        layer_costs("resnet-50", "fine")


def test_unknown_granularity():
    with pytest.raises(BadInput, match="granularity"):
        layer_costs("tiny-cnn", "coarse")


@needs_table_transformers
def test_shipped_table_is_current():
    """Regenerate with `python -m hppctl.zoo.tables` when this fails."""
    doc = json.loads(SHIPPED_TABLE.read_text())
    for name, spec in BUILTINS.items():
        assert doc["models"][name]["fingerprint"] == spec.fingerprint(), f"stale entry for {name}"


@needs_table_transformers
def test_listing_and_costs_do_not_import_torch():
    code = (
        "import sys, hppctl.cli, hppctl.zoo as z\n"
        "z.list_models(); z.layer_costs('opt-2.7b', 'fine')\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert 'transformers' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_pyproject_installs_the_shipped_tables_transformers():
    """A fresh `pip install -e .` resolves the newest transformers allowed: it must be the table's version,
    or every built-in model is traced again on first use (and the shipped-table tests skip)."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    requirement = next(d for d in project["project"]["dependencies"] if d.startswith("transformers"))
    assert f"<={shipped_table_version()}" in requirement.replace(" ", ""), requirement
