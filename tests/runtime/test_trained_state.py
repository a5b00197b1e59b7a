"""The trained model is saved and tested under its own state names: parameters and persistent
buffers only (issue 25, item 10). The stages are `torch.fx` modules that hold every buffer as
persistent, so the joined state of a BERT carried `position_ids` and `token_type_ids`, which the
model registers with `persistent=False`; building the model for the test pass refused them
(`Unexpected key(s) in state_dict`) after `--save-model` had written them."""

from __future__ import annotations

import json

import pytest
import torch

from hppctl.store import save
from hppctl.runtime.data import load_data
from hppctl.runtime.results import accuracy, build_trained, persistent_state
from hppctl.runtime.stage import Stage
from hppctl.zoo import get_model
from tests.runtime.factories import local_cluster, make_plan

NON_PERSISTENT = ("model.bert.embeddings.position_ids", "model.bert.embeddings.token_type_ids")


def _joined_stage_state(model: str, cuts: list[tuple[int, int]]) -> dict:
    """What a run returns: the stages' state dicts joined (Session's model_state)."""
    state: dict = {}
    for start, end in cuts:
        state.update(Stage(model, "block", start, end, seed=0).state_dict())
    return state


def test_joined_stage_state_of_a_bert_loads_into_the_model():
    state = _joined_stage_state("tiny-bert", [(0, 2), (2, 4)])
    assert set(NON_PERSISTENT) <= set(state)  # the stages hold them; the model does not expect them
    module = build_trained("tiny-bert", state)  # raised "Unexpected key(s) in state_dict" before
    assert set(module.state_dict()) == set(persistent_state(module, state))
    assert not set(NON_PERSISTENT) & set(module.state_dict())
    data = load_data("tests.runtime.userdata:tokens", "tiny-bert")
    assert 0.0 <= accuracy("tiny-bert", state, data.test) <= 1.0


def test_hf_bert_with_a_test_split(tmp_path):
    from transformers import BertConfig

    BertConfig(vocab_size=1200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
               max_position_embeddings=40).save_pretrained(tmp_path / "bert")
    model = f"hf:{tmp_path / 'bert'}"
    state = _joined_stage_state(model, [(0, 1), (1, 4)])
    module = build_trained(model, state)
    assert not set(NON_PERSISTENT) & set(module.state_dict())


def test_a_missing_tensor_is_still_an_error():
    state = _joined_stage_state("tiny-bert", [(0, 4)])
    del state["model.classifier.weight"]
    with pytest.raises(ValueError, match="lacks 1 of the model's tensors: model.classifier.weight"):
        build_trained("tiny-bert", state)


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_hppctl_run_of_tiny_bert_with_a_test_split_saves_and_tests_the_model(cli, tmp_path):
    plan = make_plan("tiny-bert", [((0, 2), ["a"], [4]), ((2, 4), ["b"], [4])], global_batch=16, micro_batch=4,
                     granularity="block")
    save(tmp_path / "plan.yaml", plan)
    save(tmp_path / "cluster.yaml", local_cluster("a", "b"))
    code, out, err = cli("run", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "cluster.yaml",
                         "--rounds", "2", "--dataset", "tests.runtime.userdata:tokens", "--threads", "1",
                         "--save-model", tmp_path / "model.pt", "--json")
    assert code == 0, err  # exit 1 before: Unexpected key(s) in state_dict: "model.bert.embeddings.position_ids", …
    summary = json.loads(out)
    assert 0.0 <= summary["test_accuracy"] <= 1.0
    saved = torch.load(tmp_path / "model.pt", weights_only=True)
    assert "bert.embeddings.position_ids" not in saved
    net = get_model("tiny-bert").build().model  # the wrapped model, under its own names
    net.load_state_dict(saved)  # strict
