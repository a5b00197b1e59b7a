"""Issue 25 item 8: `hppctl run --init-from PATH` starts a new run from trained weights — a
`--save-model` file or a checkpoint directory — onto any plan of the model, with a fresh optimizer,
round count and schedule; bad files are refused before any worker starts (exit 2, one line naming the
file and the first offending tensor). Before, the flag did not exist: scheduled retraining on new data
started from random weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from hppctl.runtime.checkpoint import COMPLETE
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.results import WRAPPER_PREFIX, own_names
from hppctl.store import save
from hppctl.zoo import get_model
from tests.runtime.factories import local_cluster, make_plan
from tests.runtime.reference import train_reference
from tests.runtime.test_equivalence import assert_same

DATASET = "tests.runtime.userdata:slow_features"
OPTIMIZER = ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"]
TWO_STAGES = [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])]
OTHER_CUT = [((0, 3), ["a", "b"], [3, 1]), ((3, 5), ["c"], [4])]
"""Another cut of tiny-mlp's 5 layers, its head replicated 3:1."""


def plan_files(tmp_path, stages, name: str):
    plan = make_plan("tiny-mlp", stages, global_batch=16, micro_batch=4)
    save(tmp_path / f"{name}.yaml", plan)
    save(tmp_path / "cluster.yaml", local_cluster("a", "b", "c"))
    return plan, ["--plan", tmp_path / f"{name}.yaml", "--cluster", tmp_path / "cluster.yaml", "--dataset", DATASET,
                  "--threads", "1", *OPTIMIZER]


def wrapper_names(state: dict) -> dict:
    return {WRAPPER_PREFIX + k: v for k, v in state.items()}


def trained_file(path, seed: int = 5) -> dict:
    """A --save-model file as a run writes it (the model's own names), of weights no seed-0 run starts from."""
    state = own_names(get_model("tiny-mlp").build(seed=seed).state_dict())
    torch.save(state, path)
    return state


@pytest.mark.gloo
@pytest.mark.timeout(600)
def test_init_from_model_file_and_checkpoint_onto_another_cut(cli, tmp_path):
    _, first = plan_files(tmp_path, TWO_STAGES, "two")
    code, out, err = cli("run", *first, "--rounds", "3", "--checkpoint-dir", tmp_path / "ck1",
                         "--save-model", tmp_path / "m1.pt", "--json")
    assert code == 0, err
    start = torch.load(tmp_path / "m1.pt")

    plan, other = plan_files(tmp_path, OTHER_CUT, "other")
    options = TrainOptions(rounds=4, seed=3, dataset=DATASET, optimizer="sgd", lr=0.05, momentum=0.9)
    expected = own_names(train_reference(plan, options, initial=wrapper_names(start)))
    fresh = own_names(train_reference(plan, options))
    assert any(not torch.allclose(expected[k], fresh[k], atol=1e-3) for k in expected)  # the start matters

    # from the --save-model file, with --resume on an empty directory (the first day of a cron line)
    code, out, err = cli("run", *other, "--rounds", "4", "--seed", "3", "--init-from", tmp_path / "m1.pt",
                         "--checkpoint-dir", tmp_path / "ck2", "--resume", "--save-model", tmp_path / "m2.pt", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["start_round"] == 0 and summary["rounds_run"] == 4
    assert summary["init_from"] == str(tmp_path / "m1.pt")
    assert_same(torch.load(tmp_path / "m2.pt"), expected)

    # from the checkpoint directory: its newest round, the stages joined by name, re-cut by the plan
    code, out, err = cli("run", *other, "--rounds", "4", "--seed", "3", "--init-from", tmp_path / "ck1",
                         "--save-model", tmp_path / "m3.pt", "--json")
    assert code == 0, err
    assert_same(torch.load(tmp_path / "m3.pt"), expected)

    # --resume finds a round: it wins, and --init-from is not even read (here: a file that is no model)
    (tmp_path / "junk.pt").write_bytes(b"not a model")
    code, out, err = cli("run", *other, "--rounds", "6", "--seed", "3", "--init-from", tmp_path / "junk.pt",
                         "--checkpoint-dir", tmp_path / "ck2", "--resume", "--json")
    assert code == 0, err
    assert f"--init-from: not used: --resume continues from round 4 of {tmp_path / 'ck2'}" in err
    summary = json.loads(out)
    assert summary["start_round"] == 4 and summary["init_from"] is None

    check_refused_checkpoint_dirs(cli, tmp_path, other)


def check_refused_checkpoint_dirs(cli, tmp_path, flags):
    """Checkpoint directories --init-from refuses: of another model, damaged, empty."""
    round_dir = tmp_path / "ck1" / "round-00000003"
    other_model = tmp_path / "other-model"
    shutil.copytree(tmp_path / "ck1", other_model)
    meta = json.loads((other_model / round_dir.name / COMPLETE).read_text())
    meta["plan"]["model"] = "tiny-cnn"
    (other_model / round_dir.name / COMPLETE).write_text(json.dumps(meta))
    assert_refused(cli, flags, other_model, f"{other_model / round_dir.name / COMPLETE}: plan.model: 'tiny-cnn', "
                                            f"this run trains 'tiny-mlp'")
    damaged = tmp_path / "damaged"
    shutil.copytree(tmp_path / "ck1", damaged)
    (damaged / round_dir.name / "stage-1.pt").write_bytes(b"cut short")
    assert_refused(cli, flags, damaged, f"{damaged / round_dir.name / 'stage-1.pt'}: SHA-256")
    (tmp_path / "empty").mkdir()
    assert_refused(cli, flags, tmp_path / "empty", "a directory without a complete round")
    assert_refused(cli, flags, round_dir / "stage-0.pt", "one stage of a checkpoint round; give its checkpoint "
                                                         f"directory ({tmp_path / 'ck1'})")


def assert_refused(cli, flags, path, *expected: str) -> str:
    code, out, err = cli("run", *flags, "--rounds", "2", "--init-from", path, "--save-model", path.parent / "out.pt")
    lines = err.strip().splitlines()
    assert code == 2, err
    assert out == ""  # (a pickled payload's print would land here)
    assert len(lines) == 1 and lines[0].startswith("error: --init-from: "), err
    for text in expected:
        assert text in lines[0], lines[0]
    assert not (path.parent / "out.pt").exists()  # nothing ran
    return lines[0]


class Payload:
    def __reduce__(self):
        return (print, ("an --init-from file ran code",))


def test_bad_model_files_are_refused_in_one_line(cli, tmp_path):
    _, flags = plan_files(tmp_path, TWO_STAGES, "two")
    good = trained_file(tmp_path / "good.pt")
    first = next(iter(good))

    def variant(name: str, state) -> object:
        torch.save(state, tmp_path / name)
        return tmp_path / name

    cnn = own_names(get_model("tiny-cnn").build(seed=0).state_dict())
    cnn_first_missing = next(k for k in good if k not in cnn)
    assert_refused(cli, flags, variant("cnn.pt", cnn), f"cnn.pt: {cnn_first_missing}: missing", "tiny-mlp")
    assert_refused(cli, flags, variant("extra.pt", {**good, "extra.weight": torch.zeros(2)}),
                   "extra.pt: 'extra.weight': not a tensor of tiny-mlp")
    assert_refused(cli, flags, variant("shape.pt", {**good, first: torch.zeros(3, 3)}),
                   f"shape.pt: {first}: shape [3, 3], tiny-mlp's is {list(good[first].shape)}")
    assert_refused(cli, flags, variant("double.pt", {**good, first: good[first].double()}),
                   f"double.pt: {first}: dtype torch.float64, tiny-mlp's is torch.float32")
    nan = good[first].clone()
    nan.view(-1)[0] = float("nan")
    assert_refused(cli, flags, variant("nan.pt", {**good, first: nan}), f"nan.pt: {first}: 1 NaN or infinite value")
    assert_refused(cli, flags, variant("list.pt", [good[first]]), "list.pt: expected a state dict")
    assert_refused(cli, flags, variant("pickled.pt", {first: Payload()}), "pickled.pt: not a model file torch loads "
                   "with weights_only", "it names print, a pickled object")
    assert_refused(cli, flags, tmp_path / "absent.pt", "absent.pt: no such file or directory")


def test_init_from_refused_where_it_does_not_apply(cli, tmp_path):
    # (psl plans refused it too until 2026-11-27: tests/psl/test_checkpoint.py now starts one from trained weights)
    trained_file(tmp_path / "good.pt")
    root = Path(__file__).resolve().parents[2]
    code, _, err = cli("run", "--plan", root / "examples/galaxy-local.yaml", "--cluster", root / "examples/local.yaml",
                       "--init-from", tmp_path / "good.pt")
    assert code == 2 and err.strip() == ("error: --init-from: only for training plans; "
                                         f"{root / 'examples/galaxy-local.yaml'} is an inference (galaxy) plan")
