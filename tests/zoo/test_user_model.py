"""`--model package.module:factory`: a user's own module as a zoo model (hppctl/zoo/user.py).

Layer tables, stages and the saved names of a module written for the test in a temporary directory,
and every malformed case: exit 2, one `error:` line, nothing written. (Training it on three workers:
test_user_model_run.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from hppctl.errors import BadInput
from hppctl.models.profile import ModelInput, Profile
from hppctl.zoo import build_stage, get_model, layer_costs, model_info
from hppctl.zoo.user import declare_input, import_factory, user_spec
from tests.zoo.usermodule import BROKEN, RESNET, write_module


@pytest.fixture
def resnet(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return write_module(tmp_path, RESNET)


@pytest.fixture
def broken(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return write_module(tmp_path, BROKEN)


def test_layers_of_a_user_module(resnet):
    spec = get_model(f"{resnet}:make")
    assert spec.input_shape == (3, 8, 8) and spec.input_dtype == "float32" and spec.task == "train"
    fine = layer_costs(f"{resnet}:make", "fine")
    block = layer_costs(f"{resnet}:make", "block")
    # each leaf call is a fine layer; blocks are the top-level children (a ModuleList's elements)
    assert [c.name for c in block] == ["stem", "blocks.0", "blocks.1", "pool", "classifier"]
    assert [c.name for c in fine][:4] == ["stem.0", "stem.1", "blocks.0.conv1", "blocks.0.act1"]
    assert len(fine) == 12
    params = sum(p.numel() for p in spec.build().parameters())
    assert sum(c.param_bytes for c in fine) == sum(c.param_bytes for c in block) == 4 * params
    # a cut inside a residual block carries the skip tensor too (6 channels x 8 x 8 x 4 B each)
    assert fine[2].boundary_bytes_per_sample == 2 * 6 * 8 * 8 * 4
    assert model_info(f"{resnet}:make").layers.block == 5


def test_the_input_comes_from_the_example_an_attribute_or_the_declaration(resnet):
    assert get_model(f"{resnet}:with_attribute").input_shape == (3, 8, 8)
    with pytest.raises(BadInput, match="no input shape: give --input-shape"):
        get_model(f"{resnet}:bare")
    declare_input(f"{resnet}:bare", ModelInput(shape=[3, 8, 8]))
    assert get_model(f"{resnet}:bare").input_shape == (3, 8, 8)


def test_stages_chain_to_the_whole_module(resnet):
    spec = get_model(f"{resnet}:make")
    model = spec.build(seed=1).train()
    x = torch.randn(3, 3, 8, 8)
    count = len(layer_costs(spec.name, "fine"))
    values = (x,)
    for a, b in ((0, 3), (3, 7), (7, count)):  # cuts inside the residual blocks
        values = build_stage(model, "fine", a, b)(*values)
    torch.testing.assert_close(values[0], model(x))


def test_build_is_seeded_and_keeps_the_modules_own_names(resnet):
    spec = get_model(f"{resnet}:make")
    a, b = spec.build(seed=5), spec.build(seed=5)
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), name
    own = dict(import_factory(f"{resnet}:bare", "--model")().named_parameters())
    assert sorted(k.removeprefix("model.") for k, _ in a.named_parameters()) == sorted(own)


def test_an_edited_module_is_traced_again(resnet, tmp_path):
    """The layer table is cached per fingerprint, which covers the module's source: after an edit the
    next command (a fresh process) traces the new module instead of reading the old table."""
    before = layer_costs(f"{resnet}:make", "fine")
    fingerprint = user_spec(f"{resnet}:make").fingerprint()
    (tmp_path / f"{resnet}.py").write_text(RESNET.replace("channels=6", "channels=5"))
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from hppctl.zoo import get_model, layer_costs; "
            f"s = get_model('{resnet}:make'); m = s.build(); "
            "print(s.fingerprint(), sum(c.param_bytes for c in layer_costs(s.name, 'fine')), "
            "4 * sum(p.numel() for p in m.parameters()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True,
                         env=os.environ).stdout.split()
    assert out[0] != fingerprint
    assert out[1] == out[2] != str(sum(c.param_bytes for c in before))  # the edited module's parameters
    tables = sorted(p.name for p in (tmp_path / "cache" / "zoo").iterdir())
    assert len(tables) == 2 and all(t.startswith(f"{resnet}_make-") for t in tables), tables


def test_the_same_module_in_another_directory_has_the_same_fingerprint(resnet, tmp_path):
    """A device imports the module from its copy of the `--workdir` (`~/.cache/hppctl/workdirs/<digest>/`),
    the launcher from DIR: the fingerprint covers what the source says, not where it lies, or every SSH
    device of a profile "builds a different model" (seen on a 2-host lab: each host failed)."""
    fingerprint = user_spec(f"{resnet}:make").fingerprint()
    elsewhere = tmp_path / "copy" / "of" / "workdir"
    elsewhere.mkdir(parents=True)
    (elsewhere / f"{resnet}.py").write_text((tmp_path / f"{resnet}.py").read_text())
    code = (f"import sys; sys.path.insert(0, {str(elsewhere)!r}); from hppctl.zoo import get_model; "
            f"s = get_model('{resnet}:make'); print(s.fingerprint(), sys.modules['{resnet}'].__file__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=elsewhere, check=True,
                         env=os.environ).stdout.split()
    assert out[1].startswith(str(elsewhere))  # imported from the copy
    assert out[0] == fingerprint


def test_a_block_that_branches_on_its_data_is_refused_at_fine_and_kept_whole_at_block(broken):
    with pytest.raises(BadInput) as refused:
        layer_costs(f"{broken}:gated", "fine")
    message = str(refused.value)
    assert f"{broken}.py:15 `if y.mean() > 0:`" in message and "--granularity block" in message
    block = layer_costs(f"{broken}:gated", "block")
    assert [c.name for c in block] == ["gate", "head"]
    assert block[0].forward_flops_per_sample == 2 * 4 * 8 * 8 * 3 * 9  # its convolution, counted inside it
    model = get_model(f"{broken}:gated").build(seed=0).train()
    x = torch.randn(2, 3, 8, 8)
    out = build_stage(model, "block", 1, 2)(*build_stage(model, "block", 0, 1)(x))
    torch.testing.assert_close(out[0], model(x))


# --- every malformed case: exit 2, one line, nothing written ---------------------------------------

MALFORMED = [
    (["usernet_x:make x"], "is not a model of your own in the form package.module:factory"),
    (["no_such_module_zz:make"], "--model: cannot import 'no_such_module_zz:make' (ModuleNotFoundError"),
    (["{broken}:no_such_factory"], "has no attribute 'no_such_factory'"),
    (["{broken}:not_callable"], "not a model factory (a Python function or class returning a torch.nn.Module)"),
    (["{broken}:needs_arguments"], "a model factory is called with no arguments; this one needs some"),
    (["{broken}:raises"], "the factory failed: RuntimeError: cannot find weights.pt"),
    (["{broken}:not_a_module"], "the factory must return a torch.nn.Module or (module, example_input), got dict"),
    (["{broken}:example_not_a_tensor"], "the factory's example input is a list, not a tensor"),
    (["{broken}:example_without_batch"], "its first dimension is the batch"),
    (["{broken}:float64_example"], "the example input is float64; hppctl feeds float32 or int64 inputs"),
    (["{broken}:tuple_output"], "the model fails on a batch of its input (3x8x8 float32 per sample)"),
    (["{resnet}:bare"], "no input shape: give --input-shape (one sample, e.g. 3x224x224)"),
    (["{resnet}:bare", "--input-shape", "3xx8"], "--input-shape: '3xx8' is not a per-sample shape"),
    (["{resnet}:bare", "--input-shape", "0x8x8"], "--input-shape: '0x8x8' is not a per-sample shape"),
    (["{resnet}:bare", "--input-dtype", "int64"], "--input-dtype: goes with --input-shape"),
    (["{resnet}:bare", "--input-shape", "3x8x8", "--input-dtype", "half"], "--input-dtype: unknown value 'half'"),
    (["{resnet}:bare", "--input-shape", "3x8"], "the model fails on a batch of its input (3x8 float32 per sample)"),
    (["tiny-cnn", "--input-shape", "3x8x8"], "--input-shape: only for a model of your own"),
    (["--input-shape", "3x8x8"], "--input-shape: says what one sample of a model of your own is; name the model"),
    (["{broken}:gated"],
     "`if y.mean() > 0:` (TraceError: control flow depends on tensor data); use --granularity block"),
    (["{broken}:top_level_branch", "-g", "block"], "wrap the call with torch.fx.wrap"),
]


@pytest.mark.parametrize("args, message", MALFORMED, ids=[m for _, m in MALFORMED])
def test_malformed_user_models_are_one_line(cli, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    names = {"resnet": write_module(tmp_path, RESNET), "broken": write_module(tmp_path, BROKEN)}
    argv = [a.format(**names) for a in args]
    code, out, err = cli("models", *argv)
    assert code == 2 and out == "", err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert message.format(**names) in err, err


def test_a_syntax_error_in_the_module_is_one_line(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = write_module(tmp_path, "def make(:\n")
    code, _, err = cli("models", f"{name}:make")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "cannot import" in err and "SyntaxError" in err


def test_profile_refuses_before_measuring_anything(cli, tmp_path, monkeypatch):
    """A bad model on a measured (local) cluster: one line, no profile written, no probe started (the
    measurement cache stays empty)."""
    monkeypatch.chdir(tmp_path)
    broken = write_module(tmp_path, BROKEN)
    (tmp_path / "cluster.yaml").write_text("name: l\ndevices:\n  - {name: w0, local: true}\n")
    for model, message in ((f"{broken}:raises", "the factory failed"), (f"{broken}:gated", "--granularity block")):
        code, out, err = cli("profile", "--cluster", "cluster.yaml", "--model", model, "--out", "p.json")
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "p.json").exists()
    assert not (tmp_path / "cache" / "measurements").exists()


def test_collaborative_inference_refuses_a_user_model(cli, tmp_path, resnet):
    (tmp_path / "cluster.yaml").write_text("name: l\ndevices:\n  - {name: w0, preset: rpi4}\n")
    code, _, err = cli("profile", "--cluster", "cluster.yaml", "--model", f"{resnet}:make", "--seq-len", "16",
                       "--out", "p.json")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "collaborative inference (--seq-len; strategies galaxy, megatron, sp, local) needs" in err


def test_profile_and_plan_record_the_input_spec(cli, tmp_path, resnet):
    """A preset profile of a user model given --input-shape records it; the plan copies it; neither
    needs the flag again."""
    (tmp_path / "cluster.yaml").write_text(
        "name: l\ndevices:\n  - {name: a, preset: rpi4}\n  - {name: b, preset: rpi4}\n")
    code, _, err = cli("profile", "--cluster", "cluster.yaml", "--model", f"{resnet}:bare", "--input-shape", "3x8x8",
                       "--out", "p.json")
    assert code == 0, err
    profile = Profile.model_validate_json((tmp_path / "p.json").read_text())
    assert profile.model == f"{resnet}:bare" and profile.model_input == ModelInput(shape=[3, 8, 8], dtype="float32")
    code, _, err = cli("plan", "--profile", "p.json", "--global-batch", "8", "--micro-batch", "4", "--out", "plan.json")
    assert code == 0, err
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["model"] == f"{resnet}:bare" and plan["model_input"] == {"shape": [3, 8, 8], "dtype": "float32"}


def test_zoo_profiles_and_plans_do_not_change(tmp_path):
    """model_input is left out of zoo documents: their files and digests stay byte-identical."""
    from tests.conftest import make_profile

    profile = make_profile(layers=5, speeds=(1.0,))
    assert "model_input" not in profile.model_dump(mode="json")


def test_a_malformed_recorded_input_is_one_line_naming_the_field(cli, tmp_path, resnet):
    """A plan file edited by hand: `model_input` is validated as the rest of the document."""
    from hppctl.store import save
    from tests.runtime.factories import local_cluster, make_plan

    plan = make_plan("tiny-mlp", [((0, 5), ["a"], [4])], global_batch=8, micro_batch=4)
    save(tmp_path / "cluster.yaml", local_cluster("a"))
    doc = plan.model_dump(mode="json") | {"model": f"{resnet}:make", "model_input": {"shape": [3, 0, 8]}}
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    code, out, err = cli("run", "--plan", "plan.json", "--cluster", "cluster.yaml", "--log", "w.log")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "plan.json: model_input.shape.1:" in err and not (tmp_path / "w.log").exists()


TOKENS = '''
import torch
from torch import nn


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids):
        return self.head(self.embed(ids).mean(dim=1))


def make():
    return Bag(), torch.randint(0, 100, (1, 16))
'''


def test_a_token_model_takes_int64_ids_within_its_vocabulary(tmp_path, monkeypatch):
    from hppctl.runtime.data import load_data

    monkeypatch.chdir(tmp_path)
    name = write_module(tmp_path, TOKENS)
    spec = get_model(f"{name}:make")
    assert (spec.input_shape, spec.input_dtype, spec.input_kind, spec.vocab) == ((16,), "int64", "tokens", 100)
    assert [c.name for c in layer_costs(spec.name, "block")] == ["embed", "head"]
    data = load_data("synthetic", spec.name)  # ids drawn from the embedding's 100, labels over 3 classes
    assert data.num_classes == 3 and int(data.train.inputs.max()) < 100
