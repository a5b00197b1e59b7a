"""Device presets: numbers from the datasheets, non-linear batch curves, classes, ordering of devices."""

import pytest

from hppctl.errors import UnknownPreset
from hppctl.models.profile import LayerCost
from hppctl.profiling import presets
from hppctl.profiling.presets import PRESETS, classify, get_preset, kernel_count
from tests.profiling.layers import conv, elementwise, linear, small_cnn

GRID = [1, 2, 4, 8, 16, 32, 64, 128, 256]
REQUIRED = ("jetson-nano", "jetson-tx2", "jetson-nx", "rpi4", "laptop-cpu")


def test_required_presets_exist_with_datasheet_derived_peaks():
    assert set(REQUIRED) <= set(PRESETS)
    # cores x 2 FLOPs per FMA x clock (docs/presets.md)
    assert PRESETS["jetson-nano"].peak_flops == pytest.approx(235.9e9, rel=1e-3)   # 472 GFLOPS FP16 / 2
    assert PRESETS["jetson-tx2"].peak_flops == pytest.approx(665.6e9, rel=1e-3)    # 1.33 TFLOPS FP16 / 2
    assert PRESETS["jetson-nx"].peak_flops == pytest.approx(844.8e9, rel=1e-3)
    assert PRESETS["rpi4"].peak_flops == pytest.approx(48e9)
    assert PRESETS["jetson-nano"].memory_total_bytes == 4 * 2**30
    assert PRESETS["jetson-tx2"].memory_total_bytes == PRESETS["jetson-nx"].memory_total_bytes == 8 * 2**30


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_is_complete_and_sane(name):
    p = PRESETS[name]
    assert 0 < p.memory_budget_bytes < p.memory_total_bytes
    assert set(p.efficiency) == set(presets.CLASSES) and set(p.backward_ratio) == set(presets.CLASSES)
    assert all(0 < e <= 1 for e in p.efficiency.values())
    assert all(1 <= r <= 3 for r in p.backward_ratio.values())
    assert 0 < p.memory_efficiency <= 1 and p.op_overhead_s > 0 and p.sources


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("layer", small_cnn(), ids=lambda l: l.name)
def test_per_sample_time_falls_with_batch_size(name, layer):
    p = PRESETS[name]
    per_sample = [p.forward_seconds(layer, b) / b for b in GRID]
    assert per_sample[0] > per_sample[GRID.index(64)]          # small batches under-use the device
    assert all(a >= b for a, b in zip(per_sample, per_sample[1:]))  # and never get cheaper per sample
    times = [p.forward_seconds(layer, b) for b in GRID]
    assert all(a < b for a, b in zip(times, times[1:]))        # but a bigger batch still takes longer


def test_time_is_not_proportional_to_batch_on_a_gpu():
    p = PRESETS["jetson-tx2"]
    layer = conv("c", 64, 64, 8)
    t1, t2, t256 = (p.forward_seconds(layer, b) for b in (1, 2, 256))
    assert t2 < 1.5 * t1                  # nearly flat at small batches (Fig. 6)
    assert t256 / 256 < t1 / 4            # saturated per-sample time is far below batch-1 time


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("layer", small_cnn(), ids=lambda l: l.name)
def test_backward_is_the_class_ratio_times_forward(name, layer):
    p = PRESETS[name]
    ratio = p.backward_ratio[classify(layer)]
    for b in (1, 32):
        assert p.backward_seconds(layer, b) == pytest.approx(ratio * p.forward_seconds(layer, b))
    if classify(layer) in ("conv", "matmul"):
        assert ratio == pytest.approx(2.0)


@pytest.mark.parametrize("faster, slower", [("jetson-tx2", "jetson-nano"), ("jetson-nx", "jetson-tx2"),
                                            ("jetson-orin-nano", "jetson-nx"), ("laptop-cpu", "rpi4"),
                                            ("jetson-nano", "rpi4")])
def test_faster_device_is_faster_on_compute_heavy_layers(faster, slower):
    heavy = conv("c", 256, 256, 14)
    for b in (8, 32, 64):
        assert PRESETS[faster].forward_seconds(heavy, b) < PRESETS[slower].forward_seconds(heavy, b)


def test_tx2_beats_nano_on_every_layer_and_batch():
    for layer in small_cnn():
        for b in GRID:
            assert PRESETS["jetson-tx2"].forward_seconds(layer, b) < PRESETS["jetson-nano"].forward_seconds(layer, b)


def test_depthwise_is_much_less_efficient_than_dense_conv():
    p = PRESETS["jetson-tx2"]
    dense, dw = conv("d", 128, 128, 16), conv("w", 128, 128, 16, groups=128)
    per_flop = [p.forward_seconds(l, 256) / l.forward_flops_per_sample for l in (dense, dw)]
    assert per_flop[1] > 5 * per_flop[0]


def test_memory_bound_layers_follow_bandwidth_not_flops():
    bn = elementwise("bn", "BatchNorm2d", 256, 32)
    nx, tx2 = PRESETS["jetson-nx"], PRESETS["jetson-tx2"]
    # NX has more FLOP/s but less bandwidth than TX2 (51.2 vs 59.7 GB/s): a saturated BN is slower on NX
    assert nx.forward_seconds(bn, 256) > tx2.forward_seconds(bn, 256)


def test_weights_are_read_once_per_call_so_a_big_linear_at_batch_1_is_memory_bound():
    p = PRESETS["jetson-nano"]
    fc = linear("fc", 4096, 4096)
    weight_read = fc.param_bytes / (p.memory_bandwidth_bytes_per_s * p.memory_efficiency)
    assert p.forward_seconds(fc, 1) >= weight_read


@pytest.mark.parametrize("layer, expected", [
    (conv("c", 64, 64, 8), "conv"),
    (conv("dw", 64, 64, 8, groups=64), "depthwise"),
    (conv("dw5", 64, 64, 8, k=5, groups=64), "depthwise"),
    (LayerCost(name="x", kind="EfficientNetDepthwiseConv2d", boundary_bytes_per_sample=4096,
               activation_bytes_per_sample=4096, param_bytes=100, forward_flops_per_sample=10**7), "depthwise"),
    (linear("fc", 128, 10), "matmul"),
    (elementwise("bn", "BatchNorm2d", 8, 8), "memory"),
    (elementwise("ln", "LayerNorm", 8, 8), "memory"),
    (elementwise("g", "GELUActivation", 8, 8), "memory"),
    (elementwise("b", "BertLayer", 8, 8), "block-transformer"),
    (elementwise("r", "ResNetBottleNeckLayer", 8, 8), "block-cnn"),
    (elementwise("m", "MobileNetV2InvertedResidual", 8, 8), "block-cnn"),
    (LayerCost(name="f", kind="functional", boundary_bytes_per_sample=400, activation_bytes_per_sample=400,
               param_bytes=0, forward_flops_per_sample=10**6), "matmul"),
    (LayerCost(name="f", kind="functional", boundary_bytes_per_sample=400, activation_bytes_per_sample=400,
               param_bytes=0, forward_flops_per_sample=100), "memory"),
])
def test_classify(layer, expected):
    assert classify(layer) == expected


def test_blocks_pay_one_overhead_per_kernel():
    assert kernel_count(conv("c", 3, 3, 3)) == 1
    assert kernel_count(elementwise("m", "MobileNetV2InvertedResidual", 8, 8)) == 9
    assert kernel_count(elementwise("b", "BertLayer", 8, 8)) == 20
    assert kernel_count(elementwise("x", "SomeNewBlock", 8, 8)) == presets.DEFAULT_BLOCK_OPS


def test_unknown_preset_names_the_device_and_the_known_presets():
    with pytest.raises(UnknownPreset) as e:
        get_preset("jetson-xavier-agx", device="agx0", source="c.yaml: devices.3.preset")
    msg = str(e.value)
    assert "c.yaml: devices.3.preset" in msg and "'agx0'" in msg and "'jetson-xavier-agx'" in msg
    assert all(name in msg for name in REQUIRED)


def test_presets_module_does_not_import_torch():
    import subprocess
    import sys
    code = "import sys, hppctl.profiling.from_presets; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
