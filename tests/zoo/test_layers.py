"""Layer grouping and cost rules, checked against hand-computed values on the tiny models."""

from __future__ import annotations

import pytest

from hppctl.zoo import get_model, layer_costs, stage_io, trace
from hppctl.zoo.tables import compute_entry
from tests.zoo.conftest import needs_table_transformers

TINY = ("tiny-mlp", "tiny-cnn", "tiny-bert")


def test_tiny_cnn_fine_layers():
    names = [c.name for c in layer_costs("tiny-cnn", "fine")]
    assert names == [
        "stem.0", "stem.1", "stem.2",
        "blocks.0.conv1", "blocks.0.bn1", "blocks.0.act1", "blocks.0.conv2", "blocks.0.bn2", "blocks.0.act2",
        "pool", "fc",
    ]  # fmt: skip
    assert [c.name for c in layer_costs("tiny-cnn", "block")] == ["stem", "blocks.0", "head"]
    assert [c.kind for c in layer_costs("tiny-cnn", "block")] == ["Stem", "ResidualBlock", "Head"]


def test_cut_inside_residual_block_carries_the_skip_tensor():
    # 4 channels × 8 × 8 fp32 = 1024 bytes per feature map.
    costs = {c.name: c for c in layer_costs("tiny-cnn", "fine")}
    assert costs["stem.2"].boundary_bytes_per_sample == 1024  # only the block input
    # After conv1 the cut carries conv1's output AND the block input still waiting for `y + x`.
    assert costs["blocks.0.conv1"].boundary_bytes_per_sample == 1024 + 1024
    assert costs["blocks.0.conv2"].boundary_bytes_per_sample == 1024 + 1024
    # The add is folded into bn2 (the leaf call before it): after it, the skip is consumed.
    assert costs["blocks.0.bn2"].boundary_bytes_per_sample == 1024
    assert costs["blocks.0.bn2"].activation_bytes_per_sample == 1024 + 1024  # bn2 output + the sum
    assert stage_io("tiny-cnn", "fine", 3) == ["model_stem_2", "model_blocks_0_conv1"]


def test_last_boundary_is_the_model_output():
    assert layer_costs("tiny-cnn", "fine")[-1].boundary_bytes_per_sample == 10 * 4
    assert layer_costs("tiny-bert", "block")[-1].boundary_bytes_per_sample == 2 * 4  # 2 labels
    assert stage_io("tiny-cnn", "fine", -1) == ["x"]


def test_flops_rules():
    costs = {c.name: c for c in layer_costs("tiny-mlp", "fine")}
    assert costs["blocks.0.0"].forward_flops_per_sample == 2 * 32 * 64  # Linear: 2·in·out
    assert costs["blocks.1.0"].forward_flops_per_sample == 2 * 64 * 64
    assert costs["head"].forward_flops_per_sample == 2 * 64 * 10
    assert costs["blocks.0.1"].forward_flops_per_sample == 64  # ReLU: one per element
    conv = {c.name: c for c in layer_costs("tiny-cnn", "fine")}
    assert conv["stem.0"].forward_flops_per_sample == 2 * (4 * 8 * 8) * 3 * 3 * 3  # 2·out·Cin·k²
    assert conv["blocks.0.conv1"].forward_flops_per_sample == 2 * (4 * 8 * 8) * 4 * 3 * 3


def test_param_bytes_per_layer():
    costs = {c.name: c for c in layer_costs("tiny-cnn", "fine")}
    assert costs["stem.0"].param_bytes == 4 * (4 * 3 * 3 * 3)
    assert costs["stem.1"].param_bytes == 4 * 8  # BatchNorm weight + bias; running stats are buffers
    assert costs["fc"].param_bytes == 4 * (4 * 10 + 10)


def test_transformer_flops_count_attention():
    """tiny-bert, one layer: 4 h² projections + 2 h·4h MLP per token, plus QKᵀ and PV."""
    seq, hidden = 16, 64
    block = layer_costs("tiny-bert", "block")[1]
    matmuls = 2 * seq * (4 * hidden * hidden + 2 * hidden * 4 * hidden) + 2 * 2 * seq * seq * hidden
    assert matmuls <= block.forward_flops_per_sample <= 1.1 * matmuls


@needs_table_transformers
@pytest.mark.parametrize("name", TINY)
def test_shipped_table_matches_a_fresh_trace(name):
    fresh = compute_entry(get_model(name))
    from hppctl.zoo.cache import lookup

    assert lookup(get_model(name)) == fresh


def test_fine_layers_nest_in_block_layers():
    for name in ("tiny-cnn", "tiny-bert", "mobilenetv2"):
        traced = trace(name)
        fine_ends = {layer.nodes[-1] for layer in traced.layers("fine")}
        for layer in traced.layers("block"):
            assert layer.nodes[-1] in fine_ends, (name, layer.name)


def test_train_and_eval_traces_have_the_same_layers():
    for name in ("tiny-bert", "tiny-cnn"):
        for granularity in ("fine", "block"):
            train = [layer.name for layer in trace(name, "train").layers(granularity)]
            evaluation = [layer.name for layer in trace(name, "eval").layers(granularity)]
            assert train == evaluation


@needs_table_transformers
@pytest.mark.slow
def test_shipped_table_matches_fresh_traces_for_every_model():
    from hppctl.zoo import BUILTINS
    from hppctl.zoo.cache import lookup

    for name, spec in BUILTINS.items():
        assert lookup(spec) == compute_entry(spec), name
