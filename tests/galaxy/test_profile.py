"""Galaxy's profiler: presets (modelled), a local device (measured by the inference-blocks probe), shapes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hppctl.models.cluster import ClusterSpec
from hppctl.models.inference import InferenceProfile
from hppctl.profiling.inference import block_bytes, inference_profile, model_shapes
from tests.galaxy.factories import hf_model

PRESETS = ClusterSpec.model_validate({"name": "p", "bandwidth": "125mbit", "devices": [
    {"name": "nx", "preset": "jetson-nx"}, {"name": "nano", "preset": "jetson-nano"}]})


@pytest.mark.parametrize("model, layers, params_gb", [("bert-large", 24, 0.302), ("gpt2-large", 36, 0.708),
                                                      ("opt-1.3b", 24, 1.208)])
def test_block_bytes_match_the_paper_footprints(model, layers, params_gb):
    # notes/galaxy.md §3.7: l * (M_att + M_mlp) in parameters reproduces Table I's footprints
    shapes = model_shapes(model)
    att, mlp = block_bytes(shapes, 1)
    assert shapes.layers == layers
    assert layers * (att + mlp) / 1e9 == pytest.approx(params_gb, rel=0.01)


def test_preset_profile_grows_with_work_and_is_faster_on_the_faster_device():
    profile = inference_profile(PRESETS, "bert-large", [128, 284])
    nx, nano = profile.devices
    for device in (nx, nano):
        for t in device.timings:
            for grid in (t.attention, t.mlp, t.connective):
                assert grid.seconds == sorted(grid.seconds)
        assert device.timings[1].mlp.seconds[-1] > device.timings[0].mlp.seconds[-1]
    assert nx.timings[1].mlp.seconds[-1] < nano.timings[1].mlp.seconds[-1]
    assert profile.embedding_bytes == (30522 + 512 + 2) * 1024 * 4


@pytest.mark.gloo
def test_measured_local_device_through_the_cli(tmp_path, cli):
    hf_model("opt", seed=1).save_pretrained(tmp_path / "ckpt")
    (tmp_path / "c.yaml").write_text("name: one\ndevices:\n  - {name: me, local: true, memory: 2GB}\n")
    code, out, err = cli("profile", "--cluster", tmp_path / "c.yaml", "--model", f"hf:{tmp_path / 'ckpt'}",
                         "--seq-len", "9,16", "--repeats", 1, "--warmup", 0, "--threads", 1, "--json")
    assert code == 0, err
    profile = InferenceProfile.model_validate_json(json.dumps(json.loads(out)))
    (device,) = profile.devices
    assert device.source == "measured" and device.memory_bytes == 2 * 10**9
    assert [t.seq_len for t in device.timings] == [9, 16]
    assert device.timings[0].attention.sizes == [1, 2, 3, 4] and device.timings[1].connective.sizes[-1] == 16
    assert profile.family == "opt" and (profile.hidden, profile.heads, profile.intermediate) == (32, 4, 128)
    # its cores are measured; alone, it has nobody to measure its communication CPU with
    assert device.cpu_cores and device.cpu_cores > 0
    assert device.comm_cpu_s_per_byte is None and device.allreduce_cpu_s_per_byte is None


@pytest.mark.gloo
def test_two_measured_devices_get_their_cpu_per_byte_of_communication_measured_over_the_link(tmp_path, cli):
    """profiling/comm_cpu.py: two one-layer runs (plain rings, then gloo's AllReduce) over the devices'
    own link fill comm_cpu_s_per_byte and allreduce_cpu_s_per_byte, which the planner charges to a
    device without a spare core."""
    hf_model("gpt2", seed=2).save_pretrained(tmp_path / "ckpt")
    (tmp_path / "c.yaml").write_text("name: two\nbandwidth: 1gbit\ndevices:\n"
                                     "  - {name: a, local: true, memory: 1GB}\n  - {name: b, local: true, memory: 1GB}\n")
    code, out, err = cli("profile", "--cluster", tmp_path / "c.yaml", "--model", f"hf:{tmp_path / 'ckpt'}",
                         "--seq-len", "12", "--repeats", 1, "--warmup", 0, "--threads", 1, "--json")
    assert code == 0, err
    profile = InferenceProfile.model_validate_json(json.dumps(json.loads(out)))
    for device in profile.devices:
        assert 0 < device.comm_cpu_s_per_byte < 1e-3 and 0 < device.allreduce_cpu_s_per_byte < 1e-3, device.name
        assert device.cpu_cores and device.threads == 1


def test_reading_a_transformers_shape_keeps_the_hub_offline():
    # hppctl never downloads (zoo/build.py sets HF_HUB_OFFLINE before transformers is imported);
    # model_shapes imported transformers first, and the hub read "online" from then on.
    code = ("import os; os.environ.pop('HF_HUB_OFFLINE', None)\n"
            "from hppctl.profiling.inference import model_shapes\n"
            "model_shapes('distilbert')\n"
            "import huggingface_hub.constants as c; print(c.HF_HUB_OFFLINE)")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "True"
