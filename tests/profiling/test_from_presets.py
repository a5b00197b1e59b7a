"""build_preset_profile: grids, memory budgets, links, refusals, round trips, block = sum of kernels."""

import pytest

from hppctl.errors import BadInput, UnknownPreset
from hppctl.models.cluster import ClusterSpec
from hppctl.models.profile import Profile
from hppctl.profiling.from_presets import (DEFAULT_BATCH_SIZES, build_preset_profile, group_layers, layer_times,
                                           preset_devices, resolve_presets)
from hppctl.profiling.presets import PRESETS, classify
from hppctl.store import load, save
from tests.profiling.layers import block_of, small_cnn


def cluster(**overrides) -> ClusterSpec:
    data = {
        "name": "t", "bandwidth": "100mbit",
        "devices": [{"name": "nano0", "preset": "jetson-nano"}, {"name": "tx0", "preset": "jetson-tx2"},
                    {"name": "nx0", "preset": "jetson-nx", "memory": "3GB"}],
        "links": [{"between": ["nano0", "nx0"], "bandwidth": "20mbit"}],
    }
    data.update(overrides)
    return ClusterSpec.model_validate(data)


def build(c=None, layers=None, **kw):
    kw.setdefault("model", "small-cnn")
    kw.setdefault("granularity", "fine")
    return build_preset_profile(c or cluster(), layers or small_cnn(), **kw)


def test_profile_shape_and_source():
    p = build(batch_sizes=[1, 4, 16])
    assert p.source == "preset" and p.cluster == "t" and p.model == "small-cnn" and p.granularity == "fine"
    assert [d.name for d in p.devices] == ["nano0", "tx0", "nx0"]
    assert [d.kind for d in p.devices] == ["jetson-nano", "jetson-tx2", "jetson-nx"]
    for d in p.devices:
        assert d.batch_sizes == [1, 4, 16]
        assert len(d.forward_s) == len(d.backward_s) == len(small_cnn())
        assert d.peak_flops == PRESETS[d.kind].peak_flops
    assert p.layers == small_cnn()


def test_default_grid_is_powers_of_two_to_256():
    assert build().devices[0].batch_sizes == DEFAULT_BATCH_SIZES == [2**i for i in range(9)]


def test_grid_is_sorted_and_deduplicated():
    assert build(batch_sizes=[8, 1, 8, 2]).devices[0].batch_sizes == [1, 2, 8]


@pytest.mark.parametrize("bad", [[], [0], [4, -1], [2.5], [True]])
def test_bad_batch_sizes_are_refused(bad):
    with pytest.raises(BadInput, match="batch sizes"):
        build(batch_sizes=bad)


def test_per_sample_time_at_1_exceeds_per_sample_time_at_64():
    p = build()
    i64 = p.devices[0].batch_sizes.index(64)
    for d in p.devices:
        total = [sum(f[i] + b[i] for f, b in zip(d.forward_s, d.backward_s)) for i in range(len(d.batch_sizes))]
        assert total[0] / 1 > total[i64] / 64 * 1.5


def test_backward_is_about_twice_forward():
    p = build()
    for d in p.devices:
        for layer, f, b in zip(p.layers, d.forward_s, d.backward_s):
            ratio = PRESETS[d.kind].backward_ratio[classify(layer)]
            assert b == pytest.approx([ratio * x for x in f])
        fwd, bwd = sum(map(sum, d.forward_s)), sum(map(sum, d.backward_s))
        assert 1.5 <= bwd / fwd <= 2.0


def test_faster_device_is_faster():
    p = build()
    by_name = {d.name: d for d in p.devices}
    total = {n: sum(map(sum, d.forward_s)) + sum(map(sum, d.backward_s)) for n, d in by_name.items()}
    assert total["tx0"] < total["nano0"]


def test_memory_budget_default_and_override():
    p = build()
    budgets = {d.name: d.memory_bytes for d in p.devices}
    assert budgets["nano0"] == PRESETS["jetson-nano"].memory_budget_bytes
    assert budgets["tx0"] == PRESETS["jetson-tx2"].memory_budget_bytes
    assert budgets["nx0"] == 3_000_000_000  # `memory: 3GB` in the cluster file wins


def test_links_default_and_per_pair_override():
    c = cluster()
    p = build(c)
    assert p.default_bytes_per_s == 12.5e6
    assert [(sorted(l.between), l.bytes_per_s) for l in p.links] == [(["nano0", "nx0"], 2.5e6)]
    names = [d.name for d in c.devices]
    for a in names:
        for b in names:
            if a != b:
                assert p.bandwidth_between(a, b) == c.bandwidth_between(a, b)


def test_last_link_override_wins_like_the_cluster_says():
    c = cluster(links=[{"between": ["tx0", "nx0"], "bandwidth": "10mbit"},
                       {"between": ["nx0", "tx0"], "bandwidth": "1gbit"}])
    assert build(c).bandwidth_between("tx0", "nx0") == 125e6


def test_optimizer_state_factor_is_recorded():
    assert build(optimizer_state_factor=2.0).optimizer_state_factor == 2.0
    with pytest.raises(BadInput):
        build(optimizer_state_factor=-1)


def test_unknown_preset_names_device_field_and_known_presets():
    c = cluster(devices=[{"name": "a", "preset": "jetson-nano"}, {"name": "agx", "preset": "jetson-agx"}], links=[])
    with pytest.raises(UnknownPreset) as e:
        build(c, source="lab.yaml")
    msg = str(e.value)
    assert msg.startswith("lab.yaml: devices.1.preset: device 'agx': unknown preset 'jetson-agx'")
    assert "jetson-nano" in msg and "rpi4" in msg


@pytest.mark.parametrize("device, shown", [({"name": "pi", "host": "10.0.0.5"}, "host '10.0.0.5'"),
                                           ({"name": "me", "local": True}, "local: true")])
def test_the_preset_builder_refuses_measured_devices_and_names_them(device, shown):
    c = cluster(devices=[{"name": "a", "preset": "jetson-nano"}, device], links=[])
    with pytest.raises(BadInput) as e:
        resolve_presets(c, "c.yaml")
    msg = str(e.value)
    assert msg.startswith("c.yaml: devices.1: ") and repr(device["name"]) in msg and shown in msg
    assert "not a preset" in msg and "measured" in msg
    with pytest.raises(BadInput, match="not a preset"):
        build(c)


def test_preset_devices_of_a_mixed_cluster():
    c = cluster(devices=[{"name": "a", "preset": "jetson-nano"}, {"name": "pi", "host": "10.0.0.5"},
                         {"name": "me", "local": True}], links=[])
    assert {k: v.name for k, v in preset_devices(c).items()} == {"a": "jetson-nano"}
    bad = cluster(devices=[{"name": "pi", "host": "10.0.0.5"}, {"name": "x", "preset": "jetson-agx"}], links=[])
    with pytest.raises(UnknownPreset, match="c.yaml: devices.1.preset: device 'x'"):
        preset_devices(bad, "c.yaml")


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_round_trip_through_the_store(tmp_path, suffix):
    p = build(batch_sizes=[1, 2, 64])
    path = tmp_path / f"p{suffix}"
    save(path, p)
    again = load(path, Profile)
    assert again == p and again.digest() == p.digest()


def blocks_and_parts():
    fine = small_cnn()
    parts = [fine[0:3], fine[3:6], fine[6:7], fine[7:9]]
    blocks = [block_of(parts[0], "stem", "Stem"), block_of(parts[1], "dw", "MobileNetV2InvertedResidual"),
              block_of(parts[2], "pw", "Conv2d"), block_of(parts[3], "head", "Head")]
    return fine, blocks, parts


def test_group_layers_finds_the_fine_runs_of_each_block():
    fine, blocks, parts = blocks_and_parts()
    assert group_layers(blocks, fine) == parts
    assert group_layers(blocks, fine[:-1]) is None                       # a block's run never completes
    assert group_layers(blocks[:-1], fine) is None                       # fine layers left over
    assert group_layers(fine, fine) == [[f] for f in fine]


def test_block_profile_times_are_the_sum_of_their_fine_layers():
    """Forward, backward and weight-gradient times alike (from_presets sums fine layers into blocks)."""
    fine, blocks, parts = blocks_and_parts()
    fine_profile = build(layers=fine)
    block_profile = build(layers=blocks, granularity="block", parts=parts)
    for df, db in zip(fine_profile.devices, block_profile.devices):
        start = 0
        for i, group in enumerate(parts):
            end = start + len(group)
            for table in ("forward_s", "backward_s", "weight_grad_s"):
                summed = [sum(col) for col in zip(*getattr(df, table)[start:end])]
                assert getattr(db, table)[i] == pytest.approx(summed), table
            start = end


def test_layer_times_read_the_previous_boundary():
    fine = small_cnn()
    p = PRESETS["rpi4"]
    forward, _ = layer_times(p, fine, [64])
    assert forward[4][0] == pytest.approx(p.forward_seconds(fine[4], 64, 4, fine[3].boundary_bytes_per_sample))


def test_preset_profiles_carry_each_layers_weight_gradient_part_of_its_backward():
    from hppctl.models.profile import DeviceProfile
    from hppctl.planner.cost import CostModel
    from hppctl.profiling.presets import WEIGHT_GRAD_SHARE

    p = build(batch_sizes=[1, 4, 16])
    layers = small_cnn()
    for d in p.devices:
        assert DeviceProfile.model_validate(d.model_dump()).weight_grad_s == d.weight_grad_s  # the model's validator
        assert len(d.weight_grad_s) == len(layers) and all(len(row) == 3 for row in d.weight_grad_s)
        for layer, w_row, b_row in zip(layers, d.weight_grad_s, d.backward_s):
            assert all(0.0 <= w <= b for w, b in zip(w_row, b_row))
            if layer.param_bytes == 0:  # ReLU6, pooling: no weights, no weight gradient
                assert w_row == [0.0, 0.0, 0.0]
            else:
                share = WEIGHT_GRAD_SHARE[classify(layer)]
                assert w_row == pytest.approx([share * b for b in b_row])
    assert WEIGHT_GRAD_SHARE[classify(layers[0])] > 0 and p.devices[0].weight_grad_s[0][0] > 0  # the stem conv
    cost = CostModel(p, micro_batch=4, num_micro_batches=2)
    assert cost.has_weight_grad_times
    assert 0 < cost.weight_grad_time(0, 0, len(layers), 4) < cost.backward_time(0, 0, len(layers), 4)


def test_an_embeddings_whole_backward_is_its_weight_gradient():
    from hppctl.models.profile import LayerCost
    from hppctl.profiling.presets import weight_grad_share

    embedding = LayerCost(name="emb", kind="BertEmbeddings", boundary_bytes_per_sample=32 * 512 * 4,
                          activation_bytes_per_sample=32 * 512 * 4, param_bytes=30522 * 512 * 4,
                          forward_flops_per_sample=32 * 512 * 4)
    assert weight_grad_share(embedding) == 1.0  # token ids carry no gradient: nothing else to compute
    [row] = layer_times(PRESETS["jetson-nx"], [embedding], [8])[1]
    d = build(layers=[embedding], batch_sizes=[8]).devices[2]
    assert d.weight_grad_s == [row] == d.backward_s
