"""Stages cut from the traced graph: chained, they are the model."""

from __future__ import annotations

import random

import pytest
import torch
from torch.testing import assert_close

from hppctl.errors import BadInput
from hppctl.zoo import build_stage, cut_values, get_model, layer_costs


def run_partition(model, granularity, cuts, x):
    values = (x,)
    for start, end in zip(cuts, cuts[1:]):
        stage = build_stage(model, granularity, start, end)
        values = stage(*values)
        assert len(values) == len(stage.output_names)
    assert len(values) == 1
    return values[0]


def partitions(count, rng, samples):
    yield [0, count]
    yield list(range(count + 1))  # one layer per stage
    for _ in range(samples):
        inner = sorted(rng.sample(range(1, count), k=min(count - 1, rng.randint(1, 4))))
        yield [0, *inner, count]


@pytest.mark.parametrize("name", ["tiny-cnn", "tiny-mlp", "tiny-bert"])
@pytest.mark.parametrize("granularity", ["fine", "block"])
def test_chained_stages_equal_the_model(name, granularity):
    spec = get_model(name)
    model = spec.build().eval()
    x = spec.example_input(3)  # traced at batch 2, costed at batch 1: any batch size runs
    with torch.no_grad():
        expected = model(x)
        count = len(layer_costs(name, granularity))
        for cuts in partitions(count, random.Random(0), 5):
            assert_close(run_partition(model, granularity, cuts, x), expected)


@pytest.mark.parametrize("granularity", ["fine", "block"])
def test_chained_stages_equal_mobilenetv2(granularity):
    spec = get_model("mobilenetv2")
    model = spec.build().eval()
    x = spec.example_input(2)
    with torch.no_grad():
        expected = model(x)
        count = len(layer_costs("mobilenetv2", granularity))
        for cuts in partitions(count, random.Random(1), 3):
            assert_close(run_partition(model, granularity, cuts, x), expected)


def test_training_through_stages_gives_the_model_gradients():
    spec = get_model("tiny-cnn")
    whole, staged = spec.build(seed=3).train(), spec.build(seed=3).train()
    x, labels = spec.example_input(4), torch.arange(4)
    torch.nn.functional.cross_entropy(whole(x), labels).backward()
    out = run_partition(staged, "fine", [0, 4, 8, 11], x)  # cuts inside the residual block
    torch.nn.functional.cross_entropy(out, labels).backward()
    for (name, a), b in zip(whole.named_parameters(), staged.parameters()):
        assert_close(a.grad, b.grad, msg=name)
    # BatchNorm running statistics were updated identically (buffers are shared with the stages).
    assert_close(whole.model.blocks[0].bn1.running_mean, staged.model.blocks[0].bn1.running_mean)


def test_stage_signature_and_batch_dims():
    model = get_model("tiny-cnn").build().eval()
    stage = build_stage(model, "fine", 4, 8)
    assert stage.input_names == ["model_stem_2", "model_blocks_0_conv1"]  # skip + main branch
    assert stage.output_names == ["add"]
    assert stage.input_batch_dims == [0, 0] and stage.output_batch_dims == [0]
    assert stage.layer_range == (4, 8)


def test_stages_share_the_model_parameters():
    model = get_model("tiny-mlp").build()
    stage = build_stage(model, "block", 0, 1)
    assert stage.get_submodule("model.blocks.0.0").weight is model.get_submodule("model.blocks.0.0").weight


def test_cut_values_feed_a_single_layer():
    spec = get_model("tiny-bert")
    model = spec.build().eval()
    x = spec.example_input(2)
    with torch.no_grad():
        inputs = cut_values(model, "fine", 4, x)
        layer = build_stage(model, "fine", 5, 6)
        out = layer(*inputs)
        assert_close(out, cut_values(model, "fine", 5, x))


@pytest.mark.parametrize("start,end", [(0, 0), (3, 2), (-1, 2), (0, 12)])
def test_bad_ranges(start, end):
    model = get_model("tiny-cnn").build()
    with pytest.raises(BadInput, match=r"layer range"):
        build_stage(model, "fine", start, end)


def test_unknown_granularity_and_foreign_module():
    with pytest.raises(BadInput, match="granularity"):
        build_stage("tiny-cnn", "layers", 0, 1)
    with pytest.raises(BadInput, match="ModelSpec.build"):
        build_stage(torch.nn.Linear(2, 2), "fine", 0, 1)


def test_build_stage_from_a_name():
    stage = build_stage("tiny-mlp", "fine", 0, 5)
    x = get_model("tiny-mlp").example_input(2)
    assert stage(x)[0].shape == (2, 10)


@pytest.mark.slow
def test_every_single_layer_stage_of_every_builtin_builds():
    """On the meta model (nothing allocated): every cut of every built-in can become a stage boundary."""
    from hppctl.zoo import BUILTINS, trace
    from hppctl.zoo.stages import build_stage_module

    for name in BUILTINS:
        traced = trace(name)
        for granularity in ("fine", "block"):
            for start in range(len(traced.layers(granularity))):
                stage = build_stage_module(traced, traced.root, granularity, start, start + 1)
                assert stage.output_names


def test_builds_are_deterministic_per_seed():
    """Replicas of a stage on different devices start from the same weights."""
    spec = get_model("tiny-bert")
    a, b, c = spec.build(seed=0), spec.build(seed=0), spec.build(seed=1)
    for (name, x), y, z in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(x, y), name
    assert not all(torch.equal(x, z) for x, z in zip(a.parameters(), c.parameters()))
