"""Tier 2 (gloo): the same training planned two ways ends with the same parameters.

`asteroid` on three heterogeneous (preset) devices against `dp` on one device, same model, data,
seed and global batch: both must equal each other and the single-process loop.
"""

from __future__ import annotations

import pytest

from hppctl.models.cluster import ClusterSpec, DeviceSpec
from hppctl.models.plan import PlanRequest
from hppctl.planner import make_plan
from hppctl.profiling.from_presets import build_preset_profile
from hppctl.zoo import layer_costs
from tests.runtime.reference import train_reference
from tests.runtime.test_equivalence import assert_same, run_plan

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]


def preset_profile(model: str, presets: dict[str, str]):
    cluster = ClusterSpec(name="t", bandwidth="1gbit",
                          devices=[DeviceSpec(name=n, preset=p) for n, p in presets.items()])
    return build_preset_profile(cluster, layer_costs(model, "fine"), model=model, granularity="fine",
                                batch_sizes=[1, 2, 4, 8, 16, 32])


def test_asteroid_on_three_equals_dp_on_one():
    request = PlanRequest(global_batch=32, micro_batch=8)
    three = make_plan(preset_profile("tiny-mlp", {"nx": "jetson-nx", "tx2": "jetson-tx2", "pi": "rpi4"}),
                      request, "asteroid")
    one = make_plan(preset_profile("tiny-mlp", {"nx": "jetson-nx"}), request, "dp")
    assert len(three.devices()) == 3 and len(three.stages) > 1
    assert one.devices() == ["nx"]
    hpp, opts = run_plan(three, dataset="digits", lr=0.05)
    dp, _ = run_plan(one, dataset="digits", lr=0.05)
    assert_same(hpp.model_state(), dp.model_state())
    assert_same(dp.model_state(), train_reference(one, opts))
