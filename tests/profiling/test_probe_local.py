"""The training probe for real, on this machine: in-process on tiny models, and end to end through
profile_cluster with a `local: true` device (a subprocess). No wall-clock assertions: only shapes,
signs and the structure of what is measured."""

import json
import statistics

import pytest

from hppctl.models.cluster import ClusterSpec
from hppctl.profiling import parse, probe


@pytest.fixture(scope="module")
def measurement():
    from hppctl.profiling.train_probe import Measurement

    return Measurement("tiny-cnn", "fine", threads=1)


def test_layer_pass_times_every_layer_in_one_backward(measurement):
    x, labels = measurement.batch(4)
    forward, backward, _ = measurement.layer_pass(x, labels)
    count = len(measurement.stages)
    assert len(forward) == len(backward) == count == 11
    assert all(t > 0 for t in forward)
    # layers that hold weights (convolutions, batch norms, the classifier) all have backward work
    from hppctl.zoo import layer_costs

    weighted = [i for i, layer in enumerate(layer_costs("tiny-cnn", "fine")) if layer.param_bytes > 0]
    assert weighted and all(backward[i] > 0 for i in weighted)
    # and the pass left gradients on every parameter, as a training step does
    assert all(p.grad is not None for p in measurement.model.parameters())


def test_each_backward_is_split_into_its_weight_gradient_part_by_an_input_only_backward():
    # vgg-mini: convolutions and linear layers between parameter-free ReLUs, max-pools and a flatten
    from hppctl.profiling.train_probe import Measurement
    from hppctl.zoo import layer_costs

    m = Measurement("vgg-mini", "fine", threads=1)
    x, labels = m.batch(4)
    m.first_step(x, labels)
    passes = [m.layer_pass(x, labels) for _ in range(6)][1:]
    count = len(m.stages)
    for _, backward, weight_grad in passes:
        assert len(weight_grad) == len(backward) == count
        assert all(0.0 <= w <= b for w, b in zip(weight_grad, backward))
    backward = [statistics.median(p[1][i] for p in passes) for i in range(count)]
    weight_grad = [statistics.median(p[2][i] for p in passes) for i in range(count)]
    layers = layer_costs("vgg-mini", "fine")
    weighted = [i for i, layer in enumerate(layers) if layer.param_bytes > 0]
    free = [i for i, layer in enumerate(layers) if layer.param_bytes == 0]
    assert {layers[i].kind for i in free} >= {"ReLU", "MaxPool2d"}
    share = lambda idx: sum(weight_grad[i] for i in idx) / sum(backward[i] for i in idx)  # noqa: E731
    # the convolutions' and linear layers' weight gradients are a real part of their backward; a layer
    # without parameters has none: only the two runs' noise, clamped at zero, is left
    assert share(weighted) > 0.2
    assert share(free) < share(weighted) / 3
    # and the passes still leave gradients on every parameter, as a training step does
    assert all(p.grad is not None for p in m.model.parameters())


def test_the_whole_backward_runs_without_the_input_only_gradients_alive(measurement, monkeypatch):
    """The input-only run's gradients (one per tensor crossing a cut: every activation's size) kept
    alive through the whole backward slowed it by 15-25 % on mobilenetv2 (batch 16 and 64, medians of
    11 passes beside a plain pass), so every measured backward_s came out high. Only layer 0's output
    gradients may outlive the input-only run (its own weight-gradient measurement reads them)."""
    import weakref

    import torch

    from hppctl.profiling.train_probe import Measurement

    returned: list = []
    grad = torch.autograd.grad

    def remembering_grad(*args, **kwargs):
        out = grad(*args, **kwargs)
        if not returned:  # the pass's input-only run: the first call
            returned.extend(weakref.ref(g) for g in out if g is not None)
        return out

    alive_at_whole_backward: list[int] = []
    stamped = Measurement._stamped_backward

    def checking(self, starts, run):
        if run.__name__ == "backward":  # the whole backward (loss.backward)
            alive_at_whole_backward.append(sum(r() is not None for r in returned))
        return stamped(self, starts, run)

    monkeypatch.setattr(torch.autograd, "grad", remembering_grad)
    monkeypatch.setattr(Measurement, "_stamped_backward", checking)
    x, labels = measurement.batch(4)
    measurement.layer_pass(x, labels)
    first_outputs = 1  # tiny-cnn's layer 0 has one output
    assert len(returned) > 5 and alive_at_whole_backward == [first_outputs]


def test_an_embedding_fed_token_ids_has_its_whole_backward_as_weight_gradient():
    # tiny-bert's layer 0 is the word embedding: its input carries no gradient, so nothing of its
    # backward is input-gradient work (the weight gradient is a scatter into the embedding table)
    from hppctl.profiling.train_probe import Measurement

    m = Measurement("tiny-bert", "fine", threads=1)
    x, labels = m.batch(4)
    assert not x.is_floating_point()
    passes = [m.layer_pass(x, labels) for _ in range(3)]
    for _, backward, weight_grad in passes:
        assert all(0.0 <= w <= b for w, b in zip(weight_grad, backward))
        assert weight_grad[0] == backward[0] > 0


def test_the_cost_of_calling_one_layer_stage_is_measured_against_one_module_over_all_layers(measurement):
    # tiny-cnn's 11 one-layer stages: a few microseconds each of calls and clock reads on any machine,
    # far below the smallest layer's forward (no wall-clock bound: just what it is made of)
    x, labels = measurement.batch(4)
    forward, _, _ = measurement.layer_pass(x, labels)
    cost = measurement.stage_call_cost(reps=5)
    assert 0.0 <= cost < max(forward)
    assert not measurement.norms_in_eval  # BatchNorm back in training mode for what follows


def test_batchnorm_falls_back_to_eval_mode_only_where_training_refuses(measurement):
    x, labels = measurement.batch(2)
    assert measurement.first_step(x, labels) == [] and not measurement.norms_in_eval


def test_probe_records_for_a_tiny_model(capsys):
    args = {"model": "tiny-mlp", "granularity": "fine", "batch_sizes": [2, 1], "threads": 1, "repeats": 2,
            "warmup": 1, "window_s": 0.01, "passes": {"2": 1}}
    assert probe.main(["train", "--args", json.dumps(args)]) == 0
    found = parse.records(capsys.readouterr().out)
    kinds = [r["type"] for r in found]
    assert kinds[0] == "setup" and kinds[-1] == "done"
    memory = [r["batch_size"] for r in found if r["type"] == "memory"]
    passes = [r["batch_size"] for r in found if r["type"] == "pass"]
    assert memory == [1, 2]  # ascending
    assert sorted(passes) == [1, 1, 2]  # batch 2 needed one more pass only (resume)
    assert passes == [1, 2, 1]  # round-robin
    setup, batches, _ = parse.batches_from_output(found)
    assert setup.layers == 5 and setup.model_fingerprint
    for record in (r for r in found if r["type"] == "pass"):
        assert len(record["weight_grad"]) == 5
        assert all(0.0 <= w <= b for w, b in zip(record["weight_grad"], record["backward"]))
    assert all(b.weight_grad is not None for b in batches)
    [raw] = [r for r in found if r["type"] == "setup"]
    assert raw["stage_call_s"] == setup.stage_call_s  # sent by the probe, not the record's default


def test_a_budget_below_the_model_itself_skips_every_batch_size(capsys):
    # the probe with torch and the model is ~320 MB of RSS: nothing fits a 1-byte budget
    args = {"model": "tiny-mlp", "granularity": "fine", "batch_sizes": [1, 1 << 20], "threads": 1, "repeats": 1,
            "warmup": 0, "window_s": 0.0, "memory_budget_bytes": 1}
    assert probe.main(["train", "--args", json.dumps(args)]) == 0
    found = parse.records(capsys.readouterr().out)
    assert [r["type"] for r in found if r["type"] in ("memory", "pass")] == []
    skips = [r for r in found if r["type"] == "skip"]
    assert [r["batch_size"] for r in skips] == [1, 1 << 20] and "exceeds 90%" in skips[0]["reason"]


def test_a_first_batch_size_far_too_large_is_skipped_before_it_is_allocated(capsys):
    # it used to run the step and fail the device with torch's allocation error
    args = {"model": "tiny-mlp", "granularity": "fine", "batch_sizes": [1 << 34, 1 << 35], "threads": 1,
            "repeats": 1, "warmup": 0, "window_s": 0.0, "memory_budget_bytes": 4 << 30}
    assert probe.main(["train", "--args", json.dumps(args)]) == 0
    found = parse.records(capsys.readouterr().out)
    assert [r["batch_size"] for r in found if r["type"] == "skip"] == [1 << 34, 1 << 35]
    assert "from the activations kept" in found[-2]["reason"] and found[-1]["type"] == "done"


def test_registered_kinds_run_and_unknown_ones_are_errors(capsys):
    @probe.register_kind("test-echo-args")
    def echo_args(args):
        yield {"type": "args", **args}

    assert probe.main(["test-echo-args", "--args", '{"a": 1}']) == 0
    assert parse.records(capsys.readouterr().out)[0] == {"type": "args", "a": 1}
    assert probe.main(["no-such-kind"]) == 1
    assert "unknown probe kind" in parse.error_of(parse.records(capsys.readouterr().out))
    probe.KINDS.pop("test-echo-args")


def test_a_local_device_end_to_end(tmp_path):
    from hppctl.profiling.cluster import ProbeSettings, profile_cluster

    cluster = ClusterSpec.model_validate({"name": "here", "devices": [{"name": "me", "local": True}]})
    run = profile_cluster(cluster, "tiny-cnn", batch_sizes=[1, 2], cache_root=tmp_path,
                          settings=ProbeSettings(repeats=2, warmup=1, window_s=0.05))
    assert run.failures == {}
    [device] = run.profile.devices
    assert device.source == "measured" and device.batch_sizes == [1, 2] and len(device.forward_s) == 11
    assert device.measurement.clock in ("cpu", "wall") and device.runtime_bytes > 0
    assert all(p > 0 for p in device.train_peak_bytes)
    # each layer's weight-gradient part of its backward, through the probe's process and the cache
    assert len(device.weight_grad_s) == 11 and all(len(row) == 2 for row in device.weight_grad_s)
    assert all(0.0 <= w <= b for w_row, b_row in zip(device.weight_grad_s, device.backward_s)
               for w, b in zip(w_row, b_row))
    assert sum(row[-1] for row in device.weight_grad_s) > 0  # tiny-cnn's convolutions and classifier
    again = profile_cluster(cluster, "tiny-cnn", batch_sizes=[1, 2], cache_root=tmp_path,
                            settings=ProbeSettings(repeats=2, warmup=1, window_s=0.05))
    assert again.cached == {"me": [1, 2]} and again.measured == {"me": []}
    assert again.profile.devices[0].weight_grad_s == device.weight_grad_s


def test_weight_shares_by_preset_class_come_from_the_probes_layer_passes(capsys):
    # what presets.WEIGHT_GRAD_SHARE is measured with (docs/presets.md), on tiny-cnn
    from hppctl.profiling import weight_shares

    assert weight_shares.main(["--model", "tiny-cnn", "--batch", "4", "--repeats", "2"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    shares = summary["shares"]
    assert set(shares) == {"conv", "matmul", "memory", "no-weights"}  # convs, the classifier, norms, ReLU/pool
    assert sum(row["layers"] for row in shares.values()) == 11
    assert all(0.0 <= row["share"] <= 1.0 and row["backward_s"] > 0 for row in shares.values())
    assert shares["conv"]["share"] > 0
