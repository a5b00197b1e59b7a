"""quick.py (`hppctl demo --profiler quick`) for real on this machine: shapes and signs, no wall-clock bounds."""

from hppctl.models.cluster import ClusterSpec
from hppctl.profiling.quick import layer_times, quick_profile
from hppctl.zoo import layer_costs


def test_quick_layer_times_split_each_backward_into_its_weight_gradient_part():
    forward, backward, weight_grad = layer_times("vgg-mini", "fine", [2, 4], threads=1, repeats=3)
    layers = layer_costs("vgg-mini", "fine")
    assert len(forward) == len(backward) == len(weight_grad) == len(layers)
    assert all(0.0 <= w <= b for w_row, b_row in zip(weight_grad, backward) for w, b in zip(w_row, b_row))
    weighted = [i for i, layer in enumerate(layers) if layer.param_bytes > 0]
    free = [i for i, layer in enumerate(layers) if layer.param_bytes == 0]
    share = lambda idx: sum(weight_grad[i][-1] for i in idx) / sum(backward[i][-1] for i in idx)  # noqa: E731
    assert share(weighted) > 0.2  # convolutions and linear layers
    assert share(free) < share(weighted) / 3  # ReLU, max-pool, flatten: noise only


def test_a_quick_profile_can_plan_split_backwards():
    cluster = ClusterSpec.model_validate({"name": "here", "devices": [{"name": "a", "local": True},
                                                                      {"name": "b", "local": True}]})
    profile = quick_profile(cluster, "tiny-mlp", batch_sizes=[1, 2])
    for device in profile.devices:
        assert len(device.weight_grad_s) == 5 and all(len(row) == 2 for row in device.weight_grad_s)
    assert sum(row[-1] for row in profile.devices[0].weight_grad_s) > 0  # tiny-mlp's linear layers
