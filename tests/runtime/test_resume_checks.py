"""`--checkpoint-dir` / `--resume` on a damaged or hostile checkpoint (issue 23, item 6).

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
