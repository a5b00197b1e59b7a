"""`--checkpoint-dir` / `--resume` on a damaged or hostile checkpoint (issue 23, items 6 and 9).

Every refusal comes before any worker starts: exit 2, one `error:` line naming the file and what is
wrong, no traceback, and nothing in the checkpoint directory (or outside it) changed. A real
checkpoint is made once per module by a short run on local workers; each test damages a copy.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from hppctl.cli import run as hppctl
from hppctl.errors import BadInput
from hppctl.runtime.checkpoint import COMPLETE, CheckpointDir, write_bytes_atomic
from hppctl.store import save
from tests.runtime.factories import local_cluster, make_plan

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]

PLAN = make_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])], global_batch=16, micro_batch=4)
NEWEST = "round-00000002"


def run_args(folder: Path, ck: Path, rounds: int = 3) -> list[str]:
    return ["run", "--plan", str(folder / "plan.yaml"), "--cluster", str(folder / "cluster.yaml"),
            "--rounds", str(rounds), "--threads", "1", "--checkpoint-dir", str(ck)]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A folder with plan.yaml, cluster.yaml and ck/, a checkpoint of rounds 1 and 2 from a real run."""
    folder = tmp_path_factory.mktemp("made")
    save(folder / "plan.yaml", PLAN)
    save(folder / "cluster.yaml", local_cluster("a", "b"))
    assert hppctl(run_args(folder, folder / "ck", rounds=2)) == 0
    assert CheckpointDir(folder / "ck").complete_rounds() == [1, 2]
    return folder


@pytest.fixture
def ck(made, tmp_path) -> Path:
    shutil.copy(made / "plan.yaml", tmp_path / "plan.yaml")
    shutil.copy(made / "cluster.yaml", tmp_path / "cluster.yaml")
    shutil.copytree(made / "ck", tmp_path / "ck")
    return tmp_path / "ck"


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (links not followed) -> its SHA-256, or the link's target."""
    out = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            out[key] = "-> " + os.readlink(path)
        elif path.is_file():
            out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def assert_refused(cli, ck: Path, *names: str, resume: bool = True) -> str:
    """The run is refused before it starts: exit 2, one line naming `names`, nothing changed."""
    before = snapshot(ck)
    code, out, err = cli(*run_args(ck.parent, ck), *(["--resume"] if resume else []))
    assert code == 2, err
    assert out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for name in names:
        assert name in lines[0], err
    assert snapshot(ck) == before
    return lines[0]


def stage_path(ck: Path, stage: int) -> Path:
    return ck / NEWEST / f"stage-{stage}.pt"


def load_stage(ck: Path, stage: int) -> dict:
    return torch.load(stage_path(ck, stage), weights_only=True)


def replace_stage(ck: Path, stage: int, payload: object) -> None:
    """Write `payload` as the stage file, with the digest COMPLETE.json records updated to match:
    what is checked then is the content, not the digest."""
    buf = io.BytesIO()
    torch.save(payload, buf)
    stage_path(ck, stage).write_bytes(buf.getvalue())
    meta_file = ck / NEWEST / COMPLETE
    meta = json.loads(meta_file.read_text())
    if "sha256" in meta:  # (so that the test also runs on code from before digests)
        meta["sha256"][f"stage-{stage}.pt"] = hashlib.sha256(buf.getvalue()).hexdigest()
    meta_file.write_text(json.dumps(meta))


def edit_meta(ck: Path, change) -> Path:
    meta_file = ck / NEWEST / COMPLETE
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps(change(meta)))
    return meta_file


# --- item 6: the lock and temporary files ---------------------------------------------------------

@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_a_lock_that_links_to_another_file_is_refused_and_the_file_kept(cli, ck, tmp_path, link):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (ck / "LOCK").unlink()
    (os.symlink if link == "symbolic" else os.link)(victim, ck / "LOCK")
    # it used to truncate the victim to 0 bytes and train
    assert_refused(cli, ck, f"{ck}/LOCK", resume=False)
    assert victim.read_text() == "precious\n"


def test_the_lock_itself_does_not_follow_a_link(tmp_path):
    # the CLI refuses first; the lock refuses on its own too (a link planted after that check)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "ck").mkdir()
    os.symlink(victim, tmp_path / "ck" / "LOCK")
    with pytest.raises(BadInput, match="LOCK: is a symbolic link"):
        CheckpointDir(tmp_path / "ck").lock()
    assert victim.read_text() == "precious\n"


def test_a_lock_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    (tmp_path / "ck").mkdir()
    os.mkfifo(tmp_path / "ck" / "LOCK")
    with pytest.raises(BadInput, match="LOCK: is not a regular file"):
        CheckpointDir(tmp_path / "ck").lock()


def test_a_temporary_name_cannot_be_planted(tmp_path):
    # the temporary used to be `.NAME.<pid>.tmp`: a link planted there had the data written through it
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    target = tmp_path / "ck" / "stage-0.pt"
    target.parent.mkdir()
    os.symlink(victim, target.parent / f".{target.name}.{os.getpid()}.tmp")
    write_bytes_atomic(target, b"stage state")
    assert victim.read_text() == "precious\n" and target.read_bytes() == b"stage state"
    assert [p.name for p in target.parent.iterdir() if p.name.startswith(".") and not p.is_symlink()] == []


# --- item 9: the round to resume, checked before workers start -------------------------------------

def test_each_stage_file_digest_is_recorded(ck):
    meta = json.loads((ck / NEWEST / COMPLETE).read_text())
    assert meta["sha256"] == {f"stage-{p}.pt": hashlib.sha256(stage_path(ck, p).read_bytes()).hexdigest()
                              for p in (0, 1)}


def test_a_truncated_stage_file_is_refused(cli, ck):
    data = stage_path(ck, 0).read_bytes()
    stage_path(ck, 0).write_bytes(data[:1000])
    # it used to be found by the worker (exit 1, a traceback per device)
    assert_refused(cli, ck, str(stage_path(ck, 0)), "SHA-256")


def test_an_altered_stage_file_is_refused_by_its_digest(cli, ck):
    state = load_stage(ck, 1)
    state["model"]["model.head.bias"] += 1.0  # loads fine, right shapes: only the digest tells
    buf = io.BytesIO()
    torch.save(state, buf)
    stage_path(ck, 1).write_bytes(buf.getvalue())
    assert_refused(cli, ck, str(stage_path(ck, 1)), "SHA-256", "truncated or altered")


def test_a_tensor_of_another_shape_is_refused(cli, ck):
    state = load_stage(ck, 1)
    state["model"]["model.head.weight"] = torch.zeros(10, 32)
    replace_stage(ck, 1, state)
    assert_refused(cli, ck, str(stage_path(ck, 1)), "model.head.weight has shape [10, 32], the stage's is [10, 64]")


def test_a_missing_tensor_is_refused(cli, ck):
    state = load_stage(ck, 0)
    del state["model"]["model.blocks.0.0.bias"]
    replace_stage(ck, 0, state)
    assert_refused(cli, ck, str(stage_path(ck, 0)), "model.blocks.0.0.bias is missing")


def test_optimizer_state_of_another_shape_is_refused(cli, ck):
    state = load_stage(ck, 1)
    state["optimizer"]["state"][0]["momentum_buffer"] = torch.zeros(3)
    replace_stage(ck, 1, state)
    assert_refused(cli, ck, str(stage_path(ck, 1)), "optimizer.state.0.momentum_buffer")


def test_nan_weights_are_refused_naming_the_tensor(cli, ck):
    state = load_stage(ck, 1)
    state["model"]["model.head.weight"][0, 0] = float("nan")
    replace_stage(ck, 1, state)
    # it used to resume and train on silently
    assert_refused(cli, ck, str(stage_path(ck, 1)), "tensor model.head.weight holds 1 NaN or infinite value")


@pytest.mark.parametrize("payload, says", [
    (lambda state: [1, 2], "expected a stage record (a dict), got list"),
    (lambda state: {**state, "round": torch.zeros(3)}, "round is tensor("),
    (lambda state: {**state, "stage": 1}, "stage is 1, its round's record says 0"),
    (lambda state: {**state, "model": {"model.blocks.0.0.weight": 1.0}}, "model: expected tensors by name"),
    (lambda state: {**state, "optimizer": None}, "optimizer: expected a state dict"),
    (lambda state: {**state, "model": {**state["model"], "model.blocks.0.0.bias": torch.zeros(64, device="meta")}},
     "not a dense CPU tensor"),
    (lambda state: {**state, "model": {**state["model"], "model.blocks.0.0.bias": torch.zeros(64).to_sparse()}},
     "not a dense CPU tensor"),
])
def test_a_stage_record_of_other_types_is_refused(cli, ck, payload, says):
    replace_stage(ck, 0, payload(load_stage(ck, 0)))
    assert_refused(cli, ck, str(stage_path(ck, 0)), says)


class Payload:
    """Anything pickle can name: `weights_only` refuses the global."""

    def __reduce__(self):
        return (print, ("a stage file ran code",))


def test_a_pickle_payload_is_refused_in_one_line(cli, ck):
    replace_stage(ck, 0, {"round": 2, "stage": 0, "model": {}, "optimizer": Payload()})
    # weights_only refused it, but as an UnpicklingError traceback in the worker
    line = assert_refused(cli, ck, str(stage_path(ck, 0)), "weights_only", "UnpicklingError", "it names print")
    assert len(line) < 400 and "\x1b" not in line


@pytest.mark.timeout(60)
def test_a_fifo_as_stage_file_is_refused_without_blocking(cli, ck):
    stage_path(ck, 0).unlink()
    os.mkfifo(stage_path(ck, 0))
    assert_refused(cli, ck, str(stage_path(ck, 0)), "not a regular file")


def test_a_missing_stage_file_is_refused(cli, ck):
    stage_path(ck, 1).unlink()
    assert_refused(cli, ck, str(stage_path(ck, 1)), "missing")


@pytest.mark.parametrize("damage, says", [
    (lambda text: text[:100], "malformed JSON"),
    (lambda text: "[1, 2]", "expected a JSON object at the top level, got list"),
    (lambda text: "[" * 100_000, "nested too deeply"),
    (lambda text: "", "malformed JSON"),
])
def test_a_damaged_record_is_refused(cli, ck, damage, says):
    meta_file = ck / NEWEST / COMPLETE
    meta_file.write_text(damage(meta_file.read_text()))
    # each was a traceback (JSONDecodeError, TypeError)
    assert_refused(cli, ck, str(meta_file), says)


@pytest.mark.parametrize("change, says", [
    (lambda m: {k: v for k, v in m.items() if k != "stages"}, "stages: must list the stage numbers"),
    (lambda m: {k: v for k, v in m.items() if k != "round"}, "round: must be 2"),
    (lambda m: {**m, "stages": [0, "1"]}, "stages: must list the stage numbers"),
    (lambda m: {**m, "lost": [1]}, "lost: must be a list of device names"),
    (lambda m: {**m, "lost": "b"}, "lost: must be a list of device names"),
    (lambda m: {**m, "origin_plan": 7}, "origin_plan: must be a plan digest"),
    (lambda m: {**m, "plan": {"kind": "hpp"}}, "COMPLETE.json: plan: "),
    (lambda m: {**m, "plan": [1]}, "plan: expected a mapping"),
    (lambda m: {**m, "sha256": {"stage-0.pt": "x"}}, "sha256: must map stage-0.pt, stage-1.pt to 64 hex digits"),
])
def test_a_record_with_wrong_fields_is_refused(cli, ck, change, says):
    meta_file = edit_meta(ck, change)
    assert_refused(cli, ck, str(meta_file), says)


def test_a_replanned_lineage_with_a_broken_plan_is_refused(cli, ck):
    from hppctl.runtime.session import plan_digest

    def broken(meta):
        meta["plan"]["stages"][0]["devices"] = 5
        return {**meta, "origin_plan": plan_digest(PLAN), "lost": ["c"]}
    # plan_to_resume validated the recorded plan with a pydantic traceback
    assert_refused(cli, ck, str(edit_meta(ck, broken)), "plan: stages.0.devices")


def test_a_recorded_plan_cut_past_the_model_is_refused(cli, ck):
    def past(meta):
        meta["plan"]["stages"][1]["layers"] = [2, 99]
        return meta
    assert_refused(cli, ck, str(edit_meta(ck, past)), "its stages end at layer 99 where this run's end at 5")


def test_a_round_to_recut_is_checked_too(cli, ck):
    # another plan of the model: the round is re-cut, from stage files checked against the plan that wrote them
    save(ck.parent / "plan.yaml", make_plan("tiny-mlp", [((0, 1), ["a"], [4]), ((1, 5), ["b"], [4])],
                                            global_batch=16, micro_batch=4))
    state = load_stage(ck, 0)
    state["model"]["model.blocks.0.0.weight"][1, 1] = float("inf")
    replace_stage(ck, 0, state)
    before = snapshot(ck)
    code, out, err = cli(*run_args(ck.parent, ck), "--resume")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and out == "" and "Traceback" not in err and len(errors) == 1, err
    assert f"{stage_path(ck, 0)}: tensor model.blocks.0.0.weight holds 1 NaN or infinite value" in errors[0]
    assert snapshot(ck) == before


def test_a_setting_mismatch_is_one_line_before_anything_starts(cli, ck):
    # it used to be refused from inside the run, after the progress line (two lines on stderr)
    before = snapshot(ck)
    code, out, err = cli(*run_args(ck.parent, ck), "--resume", "--seed", "5")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "seed is 0, this run has 5" in err and snapshot(ck) == before


def test_a_checkpoint_from_before_digests_resumes_with_a_note(cli, ck):
    edit_meta(ck, lambda m: {k: v for k, v in m.items() if k != "sha256"})
    code, out, err = cli(*run_args(ck.parent, ck), "--resume", "--json")
    assert code == 0, err
    assert json.loads(out)["start_round"] == 2
    assert "records no stage file digests" in err
    assert "sha256" in json.loads((ck / "round-00000003" / COMPLETE).read_text())  # the next round has them
