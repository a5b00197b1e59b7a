"""`hppctl run`: pre-flight refusals (exit 2), outputs, lock, resume, worker failures."""

from __future__ import annotations

import json

import pytest
import torch

from hppctl.models.cluster import ClusterSpec, DeviceSpec
from hppctl.runtime.checkpoint import CheckpointDir
from hppctl.store import save
from hppctl.zoo.tiny import TinyMLP
from tests.runtime.factories import local_cluster, make_plan

TWO_STAGES = [((0, 2), ["a", "b"], [3, 1]), ((2, 5), ["c"], [4])]


@pytest.fixture
def files(tmp_path):
    def write(plan=None, cluster=None):
        plan = plan or make_plan("tiny-mlp", TWO_STAGES, global_batch=16, micro_batch=4)
        cluster = cluster or local_cluster("a", "b", "c")
        save(tmp_path / "plan.yaml", plan)
        save(tmp_path / "cluster.yaml", cluster)
        return tmp_path / "plan.yaml", tmp_path / "cluster.yaml"
    return write


# --- pre-flight: nothing starts, exit 2 ------------------------------------------------------------

def test_device_missing_from_cluster(cli, files):
    plan, cluster = files(cluster=local_cluster("a", "b"))
    code, out, err = cli("run", "--plan", plan, "--cluster", cluster)
    assert code == 2 and "device 'c' is not in" in err and out == ""


def test_preset_device_cannot_run(cli, files):
    inventory = ClusterSpec(name="x", devices=[DeviceSpec(name="a", local=True), DeviceSpec(name="b", local=True),
                                               DeviceSpec(name="c", preset="jetson-nano")])
    plan, cluster = files(cluster=inventory)
    code, _, err = cli("run", "--plan", plan, "--cluster", cluster)
    assert code == 2 and "'c' is a preset" in err


def test_layer_count_must_match_the_model(cli, files):
    plan, cluster = files(make_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 4), ["b"], [4])],
                                    global_batch=16, micro_batch=4))
    code, _, err = cli("run", "--plan", plan, "--cluster", cluster)
    assert code == 2 and "covers 4 layers of tiny-mlp" in err and "has 5" in err


def test_profile_digest_must_match(cli, files, tmp_path):
    from tests.conftest import make_profile

    plan, cluster = files()
    save(tmp_path / "profile.json", make_profile(layers=5, speeds=(1.0,)))
    code, _, err = cli("run", "--plan", plan, "--cluster", cluster, "--profile", tmp_path / "profile.json")
    assert code == 2 and "model" in err


@pytest.mark.parametrize("dataset, message", [
    ("imagenet", "unknown dataset"),
    ("no_such_module:f", "cannot import"),
    ("tests.runtime.userdata:wrong_shape", "shape (7,)"),
])
def test_dataset_must_load(cli, files, dataset, message):
    plan, cluster = files()
    code, _, err = cli("run", "--plan", plan, "--cluster", cluster, "--dataset", dataset)
    assert code == 2 and message in err


def test_dataset_smaller_than_a_global_batch(cli, files):
    plan, cluster = files(make_plan("tiny-mlp", TWO_STAGES, global_batch=4096, micro_batch=4))
    code, _, err = cli("run", "--plan", plan, "--cluster", cluster, "--dataset", "synthetic")
    assert code == 2 and "fewer than the plan's global batch 4096" in err


def test_digits_needs_an_image_or_feature_model(cli, files):
    plan, cluster = files(make_plan("tiny-bert", [((0, 31), ["a"], [4])], global_batch=16, micro_batch=4))
    code, _, err = cli("run", "--plan", plan, "--cluster", cluster, "--dataset", "digits")
    assert code == 2 and "token ids" in err


@pytest.mark.parametrize("flag, value, message", [
    ("--metrics", "{blocker}/m.jsonl", "--metrics: {blocker}/m.jsonl: cannot create the folder {blocker}"),
    ("--trace", "{blocker}/t.json", "--trace: {blocker}/t.json: cannot create the folder"),
    ("--save-model", "{blocker}/m.pt", "--save-model: {blocker}/m.pt: cannot create the folder"),
    ("--log", "{blocker}/w.log", "--log: {blocker}/w.log: cannot create the folder"),
    ("--checkpoint-dir", "{blocker}", "--checkpoint-dir: {blocker} is a file, not a directory"),
    ("--metrics", "{tmp}/folder.jsonl", "--metrics: {tmp}/folder.jsonl is a directory"),
    ("--listen", "127.0.0.1:99999", "--listen: '127.0.0.1:99999': port 99999 is out of range"),
    ("--listen", "127.0.0.1:x", "--listen: '127.0.0.1:x': port 'x' is not a number"),
    ("--listen", "192.0.2.1", "--listen: '192.0.2.1': this machine cannot listen on 192.0.2.1"),
])
def test_unusable_outputs_and_addresses_fail_before_any_worker(cli, files, tmp_path, flag, value, message):
    # these used to start the workers and end in a traceback (exit 1) once the run reached them
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    (tmp_path / "folder.jsonl").mkdir()
    plan, cluster = files()
    fill = {"blocker": blocker, "tmp": tmp_path}
    code, out, err = cli("run", "--plan", plan, "--cluster", cluster, "--rounds", "1", flag, value.format(**fill))
    assert code == 2, err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert message.format(**fill) in err
    assert out == "" and blocker.read_text() == ""


@pytest.mark.parametrize("args, message", [
    # --momentum, --weight-decay, --timeout: were pydantic tracebacks, exit 1
    (["--momentum", "-1"], "--momentum: must be a non-negative finite number (got -1.0)"),
    (["--weight-decay", "-0.1"], "--weight-decay: must be a non-negative finite number (got -0.1)"),
    (["--timeout", "0"], "--timeout: must be a number of seconds from 1 to 2592000 (got 0.0)"),
    (["--lr", "0"], "--lr: must be a positive finite number (got 0.0)"),
    (["--optimizer", "rmsprop"], "--optimizer: unknown value 'rmsprop' (sgd or adam)"),
    # not numbers at all: nan was a traceback, --lr inf trained the model into NaN, --timeout inf an OverflowError
    (["--lr", "nan"], "--lr: must be a positive finite number (got nan)"),
    (["--lr", "inf"], "--lr: must be a positive finite number (got inf)"),
    (["--weight-decay", "inf"], "--weight-decay: must be a non-negative finite number (got inf)"),
    (["--timeout", "inf"], "--timeout: must be a number of seconds from 1 to 2592000 (got inf)"),
    (["--heartbeat", "nan"], "--heartbeat: must be a number of seconds from 0.01 to 2592000 (got nan)"),
    (["--lr-schedule", "linear"], "--lr-schedule: unknown value 'linear' (constant or cosine)"),
    (["--warmup-rounds", "-1"], "--warmup-rounds: must be a non-negative finite number (got -1)"),
    (["--warmup-rounds", "4"], "--warmup-rounds: 4 leaves none of the run's 4 rounds at --lr"),
])
def test_bad_training_flags(cli, files, args, message):
    plan, cluster = files()
    code, out, err = cli("run", "--plan", plan, "--cluster", cluster, "--rounds", "4", *args)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert message in err


@pytest.mark.parametrize("replicated, refused", [
    pytest.param("tail", True, id="one-sample-share-where-batchnorm-sees-1x1-maps"),
    pytest.param("head", False, id="one-sample-share-where-maps-are-larger"),
])
def test_a_one_sample_share_is_refused_where_batchnorm_cannot_train_on_it(cli, files, replicated, refused):
    # mobilenetv2 (block layers, 32x32 inputs): from layer 13 on, BatchNorm sees 1x1 maps, so one sample
    # gives one value per channel and PyTorch raises in the first forward — on that device, after every
    # worker had started. Earlier layers normalise over the sample's pixels, which trains.
    shares = {"head": [((0, 13), ["a", "b"], [3, 1]), ((13, 18), ["c"], [4])],
              "tail": [((0, 13), ["a"], [4]), ((13, 18), ["b", "c"], [3, 1])]}[replicated]
    plan, cluster = files(make_plan("mobilenetv2", shares, global_batch=16, micro_batch=4, granularity="block"))
    from hppctl.models.plan import HppPlan
    from hppctl.runtime.preflight import check_model
    from hppctl.store import load

    if not refused:
        check_model(load(plan, HppPlan), str(plan))
        return
    code, out, err = cli("run", "--plan", plan, "--cluster", cluster, "--rounds", "1", "--dataset", "digits")
    assert code == 2 and out == ""
    assert err.strip() == (f"error: {plan}: stages.1.samples: c gets 1 sample of each micro-batch, and BatchNorm "
                           f"model.mobilenet_v2.layer.12.conv_3x3.normalization (layer 13) sees one value per channel "
                           f"for one sample, which PyTorch cannot train; plan with a larger --micro-batch")


def test_rejoin_goes_with_resume(cli, files, tmp_path):
    plan, cluster = files()
    code, _, err = cli("run", "--plan", plan, "--cluster", cluster, "--checkpoint-dir", tmp_path / "ck", "--rejoin")
    assert code == 2 and err.startswith("error: --rejoin: goes with --resume")


def test_resume_needs_a_checkpoint_dir(cli, files):
    plan, cluster = files()
    code, _, err = cli("run", "--plan", plan, "--cluster", cluster, "--resume")
    assert code == 2 and "--resume: needs --checkpoint-dir" in err


# --- real runs (gloo) ----------------------------------------------------------------------------

@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_outputs(cli, files, tmp_path):
    plan, cluster = files()
    code, out, err = cli("run", "--plan", plan, "--cluster", cluster, "--dataset", "tests.runtime.userdata:features",
                         "--rounds", "6", "--metrics", tmp_path / "m.jsonl", "--trace", tmp_path / "t.json",
                         "--save-model", tmp_path / "model.pt", "--checkpoint-dir", tmp_path / "ck",
                         "--checkpoint-every", "2", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["rounds_run"] == 6 and summary["test_accuracy"] is not None
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == list(range(6))
    assert {"loss", "samples_per_s", "bytes_sent", "stages", "devices"} <= set(rows[0])
    assert rows[0]["stages"][0]["devices"] == ["a", "b"] and rows[0]["bytes_sent"] > 0
    trace = json.loads((tmp_path / "t.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {"forward", "backward", "allreduce", "step", "activations", "gradients"} <= {e["cat"] for e in spans}
    assert any(e["name"] == "0F0[0:3]" for e in spans)
    # The saved model loads into the plain model class, no hppctl wrapper names.
    net = TinyMLP()
    net.load_state_dict(torch.load(tmp_path / "model.pt"))
    assert CheckpointDir(tmp_path / "ck").complete_rounds() == [4, 6]


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_lock_refuses_a_second_run(cli, files, tmp_path):
    plan, cluster = files()
    holder = CheckpointDir(tmp_path / "ck")
    holder.lock()
    try:
        code, _, err = cli("run", "--plan", plan, "--cluster", cluster, "--checkpoint-dir", tmp_path / "ck")
    finally:
        holder.unlock()
    assert code == 75 and "in use by another run" in err  # another run is active: EX_TEMPFAIL, not a crash


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_a_worker_that_fails_names_its_device(cli, files):
    plan, cluster = files()
    code, _, err = cli("run", "--plan", plan, "--cluster", cluster, "--rounds", "3",
                       "--dataset", "tests.runtime.userdata:broken_in_workers")
    assert code == 1
    assert "worker on device" in err and "unreadable on this device" in err
    assert "last lines" in err
