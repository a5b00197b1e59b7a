"""`hppctl profile` end to end through the error boundary (the zoo is replaced by a small synthetic model)."""

import json
import textwrap

import pytest

import hppctl.zoo
from hppctl.errors import UnknownModel
from hppctl.models.profile import Profile
from hppctl.store import load
from tests.profiling.layers import block_of, small_cnn

CLUSTER = """\
name: mini
bandwidth: 100mbit
devices:
  - {name: tx0, preset: jetson-tx2}
  - {name: nano0, preset: jetson-nano, memory: 2GB}
links:
  - {between: [tx0, nano0], bandwidth: 40mbit}
"""


def fake_layer_costs(name, granularity):
    if name not in ("small-cnn", "hf:/models/x"):
        raise UnknownModel(f"unknown model {name!r} (known: small-cnn)")
    fine = small_cnn()
    if granularity == "fine":
        return fine
    return [block_of(fine[0:3], "stem", "Stem"), block_of(fine[3:7], "b0", "MobileNetV2InvertedResidual"),
            block_of(fine[7:9], "head", "Head")]


@pytest.fixture(autouse=True)
def zoo(monkeypatch):
    monkeypatch.setattr(hppctl.zoo, "layer_costs", fake_layer_costs, raising=False)


@pytest.fixture
def cluster_file(tmp_path):
    path = tmp_path / "mini.yaml"
    path.write_text(CLUSTER)
    return path


def test_writes_a_preset_profile(cli, cluster_file, tmp_path):
    out = tmp_path / "out" / "p.json"
    code, stdout, stderr = cli("profile", "--cluster", cluster_file, "--model", "small-cnn", "--out", out)
    assert code == 0, stderr
    p = load(out, Profile)
    assert p.source == "preset" and p.cluster == "mini" and p.model == "small-cnn" and p.granularity == "fine"
    assert [d.name for d in p.devices] == ["tx0", "nano0"] and p.devices[1].memory_bytes == 2_000_000_000
    assert p.bandwidth_between("tx0", "nano0") == 5e6 and p.default_bytes_per_s == 12.5e6
    assert p.devices[0].batch_sizes == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert p.optimizer_state_factor == 1.0
    assert "jetson-tx2" in stdout and "wrote" in stderr


def test_json_with_out_prints_one_summary_document(cli, cluster_file, tmp_path):
    out = tmp_path / "p.yaml"
    code, stdout, _ = cli("profile", "--cluster", cluster_file, "--model", "small-cnn", "--out", out,
                          "--batch-sizes", "1,8,32", "--optimizer", "adam", "--json")
    assert code == 0
    summary = json.loads(stdout)
    p = load(out, Profile)
    assert summary["out"] == str(out) and summary["digest"] == p.digest() and summary["source"] == "preset"
    assert summary["batch_sizes"] == [1, 8, 32] and p.optimizer_state_factor == 2.0
    per_sample = summary["devices"][0]["train_s_per_sample"]
    assert per_sample["1"] > per_sample["32"]


def test_json_without_out_prints_the_profile(cli, cluster_file):
    code, stdout, _ = cli("profile", "--cluster", cluster_file, "--model", "small-cnn", "--json",
                          "--granularity", "block", "--optimizer", "sgd")
    assert code == 0
    p = Profile.model_validate(json.loads(stdout))
    assert p.granularity == "block" and len(p.layers) == 3 and p.optimizer_state_factor == 0.0


def test_block_profile_times_blocks_as_the_sum_of_their_fine_layers(cli, cluster_file):
    _, fine_out, _ = cli("profile", "--cluster", cluster_file, "--model", "small-cnn", "--json")
    _, block_out, _ = cli("profile", "--cluster", cluster_file, "--model", "small-cnn", "--json", "--granularity", "block")
    fine, block = Profile.model_validate(json.loads(fine_out)), Profile.model_validate(json.loads(block_out))
    for df, db in zip(fine.devices, block.devices):
        assert sum(map(sum, db.forward_s)) == pytest.approx(sum(map(sum, df.forward_s)))


def test_hf_model_names_reach_the_zoo(cli, cluster_file):
    code, stdout, _ = cli("profile", "--cluster", cluster_file, "--model", "hf:/models/x", "--json")
    assert code == 0 and json.loads(stdout)["model"] == "hf:/models/x"


def test_help_has_examples(cli):
    code, stdout, _ = cli("profile", "--help")
    assert code == 0 and "Examples" in stdout and "--batch-sizes" in stdout


BAD_CLUSTERS = [
    ("name: x\ndevices: [ {name: a, preset: jetson-nano\n", "malformed YAML"),
    ("name: x\ndevices:\n  - {name: a, preset: jetson-agx}\n", "devices.0.preset: device 'a': unknown preset 'jetson-agx'"),
    ("name: x\ndevices:\n  - {name: a, host: 10.0.0.9}\n  - {name: b, preset: jetson-agx}\n",
     "devices.1.preset: device 'b': unknown preset 'jetson-agx'"),
    ("name: x\nbandwidth: fast\ndevices:\n  - {name: a, preset: rpi4}\n", "bandwidth"),
    ("name: x\ndevices:\n  - {name: a, preset: rpi4, memory: -3GB}\n", "devices.0.memory"),
    ("name: x\ndevices:\n  - {name: a, preset: rpi4, colour: red}\n", "devices.0.colour"),
    ("- just\n- a list\n", "expected a mapping"),
]


@pytest.mark.parametrize("content, needle", BAD_CLUSTERS)
def test_bad_cluster_files_exit_2_with_one_line(cli, tmp_path, content, needle):
    path = tmp_path / "c.yaml"
    path.write_text(content)
    out = tmp_path / "p.json"
    code, stdout, stderr = cli("profile", "--cluster", path, "--model", "small-cnn", "--out", out)
    assert code == 2
    assert stderr.startswith("error: ") and len(stderr.strip().splitlines()) == 1, stderr
    assert str(path) in stderr and needle in stderr
    assert not out.exists() and stdout == ""


@pytest.mark.parametrize("args, needle", [
    (["--batch-sizes", "1,0,4"], "--batch-sizes: 0 is not a positive"),
    (["--batch-sizes", "-8"], "--batch-sizes: -8 is not a positive"),
    (["--batch-sizes", "1,,4"], "--batch-sizes: '' is not a whole number"),
    (["--batch-sizes", "1;2"], "--batch-sizes: '1;2' is not a whole number"),
    (["--batch-sizes", "two"], "--batch-sizes: 'two' is not a whole number"),
    (["--granularity", "layer"], "--granularity: unknown value 'layer'"),
    (["--optimizer", "lamb"], "--optimizer: unknown value 'lamb'"),
    (["--model", "vgg99"], "unknown model 'vgg99'"),
    (["--out", "p.txt"], "--out: p.txt: unknown file extension '.txt'"),
    (["--out", None], "--out: give a file"),
    (["--cluster", None], "--cluster: required"),
    (["--model", None], "--model: required"),
    (["--cluster", "no/such.yaml"], "no/such.yaml: no such file"),
    # the measurement flags are checked on a preset-only cluster too, each named with its value
    (["--repeats", "0"], "--repeats: must be a positive finite number (got 0)"),
    (["--warmup", "-1"], "--warmup: must be a non-negative finite number (got -1)"),
    (["--timeout", "-1"], "--timeout: must be a number of seconds from 1 to 2592000 (got -1.0)"),
    (["--link-seconds", "0"], "--link-seconds: must be a number of seconds from 0.1 to 3600 (got 0.0)"),
    (["--threads", "0"], "--threads: must be a positive finite number (got 0)"),
    # issue 23: non-finite, tiny and huge values passed on a preset cluster (and reached the devices)
    (["--timeout", "nan"], "--timeout: must be a number of seconds from 1 to 2592000 (got nan)"),
    (["--link-seconds", "1e400"], "--link-seconds: must be a number of seconds from 0.1 to 3600 (got inf)"),
    (["--threads", "100000"], "--threads: must be at most 1024 threads (got 100000)"),
    (["--repeats", str(10**30)], "--repeats: must be at most 1,000,000,000 (got 1000000000000000000000000000000)"),
])
def test_bad_arguments_exit_2_with_one_line(cli, cluster_file, tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    argv = {"--cluster": str(cluster_file), "--model": "small-cnn", "--out": "p.json"}
    for flag, value in zip(args[::2], args[1::2]):
        if value is None:
            argv.pop(flag)
        else:
            argv[flag] = value
    flat = ["profile"] + [x for kv in argv.items() for x in kv]
    code, stdout, stderr = cli(*flat)
    assert code == 2, stderr
    assert stderr.startswith("error: ") and len(stderr.strip().splitlines()) == 1, stderr
    assert needle in stderr
    assert not (tmp_path / "p.json").exists() and stdout == ""


def test_a_failed_run_leaves_an_existing_profile_untouched(cli, cluster_file, tmp_path):
    out = tmp_path / "p.json"
    assert cli("profile", "--cluster", cluster_file, "--model", "small-cnn", "--out", out)[0] == 0
    before = out.read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(textwrap.dedent("""\
        name: x
        devices:
          - {name: a, preset: nope}
    """))
    assert cli("profile", "--cluster", bad, "--model", "small-cnn", "--out", out)[0] == 2
    assert out.read_text() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".p.json")] == []
