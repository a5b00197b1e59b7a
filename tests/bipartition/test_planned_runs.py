"""Every Bi-Partition plan the planner makes trains like a single device (issue 24 item 2).

For a dropout-free Hugging Face BERT (`hf:`, position ids sliced from an embedding buffer), a
dropout-free MobileNetV2 and the BatchNorm CNN `tiny-cnn`, on three identical Jetson-Nano presets:
the plan each Bi-Partition strategy returns today (whatever cuts the planner picks), and the issue's
hand-written cuts whose split block starts at layer 0 (recomputed from the data), run as threads
over queues with the real executor; the parameters and BatchNorm statistics must equal the
single-process loop of a 1-device `dp` plan. One plan also runs through `hppctl run` (3 local
worker processes, gloo), the path the issue saw fail.
"""

from __future__ import annotations

import functools

import pytest
import torch

from hppctl.models.cluster import ClusterSpec, DeviceSpec
from hppctl.models.plan import HppPlan, PlanRequest
from hppctl.planner import make_plan
from hppctl.profiling.from_presets import build_preset_profile
from hppctl.runtime.config import TrainOptions
from hppctl.zoo import get_model, layer_costs
from tests.bipartition.factories import bi_plan
from tests.bipartition.threaded import train_threaded
from tests.runtime.reference import train_sharded_reference

STRATEGIES = ["bipartition", "bipartition-bsa", "bipartition-paper", "layerwise"]
MODELS = ["bert", "mobilenetv2", "tiny-cnn"]
DEVICES = ["nano0", "nano1", "nano2"]
BANDWIDTHS = ["1gbit", "100mbit"]  # the planner splits other layers at each
REQUEST = PlanRequest(global_batch=8, micro_batch=4)  # micro-batch 4: MobileNetV2's last BatchNorm is 1x1
OPTIONS = TrainOptions(rounds=2, threads=1, dataset="synthetic", lr=0.05)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """Model names, with the two `hf:` checkpoints (configs only, dropout off) and the layer-table
    cache in a temporary directory."""
    from transformers import BertConfig, MobileNetV2Config

    root = tmp_path_factory.mktemp("models")
    # vocabulary 1000: the synthetic dataset's token ids; 64 positions: the issue's [1, 64] position ids
    BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
               max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
               num_labels=2).save_pretrained(root / "bert")
    MobileNetV2Config(depth_multiplier=0.35, image_size=32, classifier_dropout_prob=0.0,
                      num_labels=10).save_pretrained(root / "mobilenetv2")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HPPCTL_CACHE_DIR", str(root / "cache"))
        yield {"bert": f"hf:{root / 'bert'}", "mobilenetv2": f"hf:{root / 'mobilenetv2'}", "tiny-cnn": "tiny-cnn"}


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread):
    """Every test here on one intra-op thread (tests/conftest.py)."""


def preset_profile(model: str, devices: list[str], bandwidth: str = "1gbit"):
    cluster = ClusterSpec(name="nanos", bandwidth=bandwidth,
                          devices=[DeviceSpec(name=d, preset="jetson-nano") for d in devices])
    return build_preset_profile(cluster, layer_costs(model, "fine"), model=model, granularity="fine",
                                batch_sizes=[1, 2, 4, 8])


@functools.lru_cache(maxsize=None)
def planned(model: str, strategy: str, bandwidth: str) -> HppPlan:
    return make_plan(preset_profile(model, DEVICES, bandwidth), REQUEST, strategy)


@functools.lru_cache(maxsize=None)
def single_device(model: str) -> dict[str, torch.Tensor]:
    """The single-process loop of a 1-device `dp` plan, micro-batch by micro-batch (BatchNorm
    normalises over a micro-batch, as every Bi-Partition worker forwards whole micro-batches)."""
    one = make_plan(preset_profile(model, DEVICES[:1]), REQUEST, "dp")
    assert [s.devices for s in one.stages] == [DEVICES[:1]]
    state = train_sharded_reference(one, OPTIONS)
    # Stage states hold non-persistent buffers too (BERT's position and token type ids), which a
    # state dict omits; training never changes them.
    constants = get_model(model).build(seed=OPTIONS.seed).named_buffers()
    return {**dict(constants), **state}


def starting_at_layer_0(model: str) -> HppPlan:
    """The issue's hand-written cuts F 0,14,28,42 / B 0,0,31,42 scaled to the model: worker b
    backwards [0, 3L/4), recomputing the forward of [0, L/3) from the data."""
    L = len(layer_costs(model, "fine"))
    return bi_plan(model, [0, L // 3, 2 * L // 3, L], [0, 0, 3 * L // 4, L], DEVICES,
                   global_batch=REQUEST.global_batch, micro_batch=REQUEST.micro_batch)


def assert_same(actual: dict, expected: dict) -> None:
    assert sorted(actual) == sorted(expected)
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


def ranges(plan: HppPlan) -> str:
    return " | ".join(f"F{s.layers} B{list(s.backward)}" for s in plan.stages)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bandwidth", BANDWIDTHS)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("model", MODELS)
def test_every_planned_bipartition_run_equals_one_device(models, model, strategy, bandwidth):
    plan = planned(models[model], strategy, bandwidth)
    print(f"{model} {strategy} {bandwidth}: {ranges(plan)}")
    assert_same(train_threaded(plan, OPTIONS), single_device(models[model]))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("model", MODELS)
def test_a_split_block_from_layer_0_recomputed_from_the_data_equals_one_device(models, model):
    plan = starting_at_layer_0(models[model])
    assert plan.stages[1].backward[0] == 0 < plan.stages[1].start  # b recomputes [0, L/3) from the data
    assert_same(train_threaded(plan, OPTIONS), single_device(models[model]))


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_hppctl_run_of_the_planned_bert_split_from_layer_0(models, cli, tmp_path):
    """The issue's failing command: `hppctl plan --strategy bipartition-paper` for the BERT on three
    Nanos, then `hppctl run` on 3 local workers; the saved model equals the single-device loop."""
    from hppctl.runtime.results import own_names, persistent_state
    from hppctl.store import load, save

    model = models["bert"]
    profile, plan_file, cluster_file, saved = (tmp_path / "p.json", tmp_path / "plan.yaml", tmp_path / "c.yaml",
                                               tmp_path / "model.pt")
    save(profile, preset_profile(model, DEVICES))
    save(cluster_file, ClusterSpec(name="local", devices=[DeviceSpec(name=d, local=True) for d in DEVICES]))
    code, out, err = cli("plan", "--profile", profile, "--global-batch", REQUEST.global_batch, "--micro-batch",
                         REQUEST.micro_batch, "--strategy", "bipartition-paper", "--out", plan_file)
    assert code == 0, err
    plan = load(plan_file, HppPlan)
    if not any(s.backward[0] == 0 and s.backward[1] > s.end for s in plan.stages):
        # The plan of the issue recomputes a split block from layer 0 (today's planner plans F[0, 0)
        # B[0, 22) on the first Nano). Should an improved search stop picking such a split here, the
        # issue's hand-written cuts keep this path covered.
        save(plan_file, starting_at_layer_0(model))
    code, out, err = cli("run", "--plan", plan_file, "--cluster", cluster_file, "--rounds", OPTIONS.rounds,
                         "--dataset", "synthetic", "--optimizer", "sgd", "--lr", OPTIONS.lr, "--threads", 1, "--save-model", saved)
    assert code == 0, err
    # the saved model holds the model's own state names: no non-persistent buffer (issue 25, item 10)
    whole = get_model(model).build(device="meta")
    assert_same(torch.load(saved, weights_only=True), own_names(persistent_state(whole, single_device(model))))
