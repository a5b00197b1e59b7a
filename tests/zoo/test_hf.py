"""`hf:PATH`: a local Hugging Face checkpoint of a supported family, never downloaded."""

from __future__ import annotations

import json

import pytest
import torch
from torch.testing import assert_close

from hppctl.errors import BadInput
from hppctl.zoo import build_stage, get_model, layer_costs, model_info


@pytest.fixture
def bert_dir(tmp_path):
    from transformers import BertConfig

    path = tmp_path / "my-bert"
    BertConfig(
        vocab_size=120, hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=40,
    ).save_pretrained(path)  # fmt: skip
    return path


@pytest.fixture
def gpt2_dir(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path / "my-gpt2"
    torch.manual_seed(7)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=90, n_embd=32, n_layer=2, n_head=2, n_positions=64))
    model.save_pretrained(path)
    return path, model


def test_config_only_checkpoint(bert_dir):
    name = f"hf:{bert_dir}"
    spec = get_model(name)
    assert spec.family == "bert" and spec.input_shape == (40,)  # min(128, max positions)
    info = model_info(name)
    assert info.layers.block == 1 + 3 + 1
    block = layer_costs(name, "block")
    assert [c.name for c in block][1:4] == ["bert.encoder.layer.0", "bert.encoder.layer.1", "bert.encoder.layer.2"]
    assert sum(c.param_bytes for c in layer_costs(name, "fine")) == 4 * info.parameters
    # a config without weights has nothing to load
    with pytest.raises(BadInput, match="cannot load weights"):
        spec.build(weights=True)


def test_checkpoint_with_weights_runs_as_stages(gpt2_dir):
    path, reference = gpt2_dir
    name = f"hf:{path}"
    spec = get_model(name)
    assert spec.task == "inference" and spec.head_class == "GPT2LMHeadModel"
    model = spec.build(weights=True).eval()
    x = spec.example_input(2)
    with torch.no_grad():
        expected = reference.eval()(input_ids=x).logits
        assert_close(model(x), expected)
        count = model_info(name).layers.block
        values = (x,)
        for start in range(count):
            stage = build_stage(name if start == 0 else model, "block", start, start + 1)
            values = stage(*values)
        assert_close(values[0], expected)


def test_causal_mask_crosses_block_cuts(gpt2_dir):
    path, _ = gpt2_dir
    costs = layer_costs(f"hf:{path}", "block")
    seq, hidden = 64, 32
    hidden_bytes, mask_bytes = seq * hidden * 4, seq * seq * 4
    assert costs[1].boundary_bytes_per_sample == hidden_bytes + mask_bytes
    stage = build_stage(get_model(f"hf:{path}").build().eval(), "block", 1, 2)
    assert len(stage.input_names) == 2  # hidden states and the 4-D causal mask
    assert stage.input_batch_dims == [0, 0]  # transformers expands the mask to (batch, 1, seq, seq)


def test_bad_paths(tmp_path):
    with pytest.raises(BadInput, match="not a directory"):
        get_model(f"hf:{tmp_path / 'missing'}")
    with pytest.raises(BadInput, match="no config.json"):
        get_model(f"hf:{tmp_path}")
    with pytest.raises(BadInput, match="needs a checkpoint directory"):
        get_model("hf:")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(BadInput, match="not readable JSON"):
        get_model(f"hf:{tmp_path}")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(BadInput, match="model_type 'llama' is not supported"):
        get_model(f"hf:{tmp_path}")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForQuestionAnswering"]}))
    with pytest.raises(BadInput, match="no supported head"):
        get_model(f"hf:{tmp_path}")


def _tiny_configs():
    import transformers as t

    return {
        "mobilenet_v2": t.MobileNetV2Config(image_size=32, depth_multiplier=0.35, num_labels=3),
        "efficientnet": t.EfficientNetConfig(
            image_size=32, width_coefficient=0.1, depth_coefficient=0.3, hidden_dim=128, num_labels=3
        ),
        "resnet": t.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 2], num_labels=3, image_size=32),
        "bert": t.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=32, max_position_embeddings=12),
        "distilbert": t.DistilBertConfig(vocab_size=50, dim=16, n_layers=2, n_heads=2, hidden_dim=32,
                                         max_position_embeddings=12),
        "gpt2": t.GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=2, n_positions=12),
        "opt": t.OPTConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, ffn_dim=32,
                           word_embed_proj_dim=16, max_position_embeddings=12),
    }  # fmt: skip


@pytest.mark.parametrize("family", list(_tiny_configs()))
def test_every_family_runs_as_single_layer_stages(tmp_path, family):
    config = _tiny_configs()[family]
    config.save_pretrained(tmp_path)
    name = f"hf:{tmp_path}"
    spec = get_model(name)
    assert spec.family == family
    model = spec.build().eval()
    x = spec.example_input(3)
    with torch.no_grad():
        expected = model(x)
        for granularity in ("fine", "block"):
            values = (x,)
            for start in range(model_info(name).layers.model_dump()[granularity]):
                values = build_stage(model, granularity, start, start + 1)(*values)
            assert_close(values[0], expected)


def test_synthetic_token_ids_stay_inside_the_vocabulary(bert_dir):
    """`--dataset synthetic` drew token ids from 0-999 whatever the model's vocabulary: an `hf:` model
    with 120 tokens failed in its embedding (IndexError: index out of range in self)."""
    from hppctl.runtime.data import load_data

    model = f"hf:{bert_dir}"
    data = load_data("synthetic", model)
    ids = data.train.inputs
    assert int(ids.max()) < 120 and int(ids.min()) >= 0
    whole = build_stage(get_model(model).build().eval(), "block", 0, model_info(model).layers.block)
    out = whole(ids[:4])  # the whole model takes them
    logits = out[0] if isinstance(out, tuple) else out
    assert logits.shape == (4, data.num_classes)
