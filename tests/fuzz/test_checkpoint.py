"""Checkpoint metadata and stage files, damaged: `run --resume` refuses before any worker starts.

One real checkpoint is made per session (a one-round run of plans/example-tiny.yaml on two local
workers, a few seconds). Each case damages a copy and resumes it with `--rounds 2`: the resume
checks run, then the gate (gates.py) stops the command where the workers would start, with exit 0.
So a damaged checkpoint that exits 0 here is one the real run would hand to its workers.
"""

from __future__ import annotations

import datetime
import io
import json
import pickle
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, note, strategies as st

from tests.fuzz.harness import assert_contract, invoke, invoke_subprocess
from tests.fuzz.mutations import mutants
from tests.fuzz.settings import fuzz_settings
from tests.fuzz.targets import LOCAL_CLUSTER, PSL_CLUSTER, TINY_PLAN

ROUND = "round-00000001"


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("checkpoint") / "ck"
    made = invoke_subprocess(["run", "--plan", TINY_PLAN, "--cluster", LOCAL_CLUSTER, "--rounds", 1, "--threads", 1,
                              "--checkpoint-dir", where], gated=False, bound_s=120)
    assert made.code == 0 and (where / ROUND / "COMPLETE.json").exists(), made.describe()
    return where


def resume(ck: Path, out: Path, rounds: int = 2) -> tuple[list, tuple[Path, ...]]:
    metrics = out / "metrics.jsonl"
    return (["run", "--plan", TINY_PLAN, "--cluster", LOCAL_CLUSTER, "--rounds", rounds, "--checkpoint-dir", ck,
             "--resume", "--metrics", metrics], (metrics,))


def damaged_copy(checkpoint: Path, into: Path) -> Path:
    ck = into / "ck"
    shutil.copytree(checkpoint, ck)
    return ck


def test_the_checkpoint_resumes_undamaged(checkpoint, tmp_path):
    argv, outputs = resume(damaged_copy(checkpoint, tmp_path), tmp_path)
    assert_contract(invoke(argv), outputs, allowed={0})


@fuzz_settings(max_examples=30)
@given(data=st.data())
def test_a_mutated_complete_json_keeps_the_contract(checkpoint, data):
    resume_mutated_complete_json(checkpoint, resume, data)


def resume_mutated_complete_json(checkpoint: Path, resumer, data) -> None:
    """Resume (`resumer`) a copy of `checkpoint` whose COMPLETE.json is a drawn mutant of its own."""
    meta = json.loads((checkpoint / ROUND / "COMPLETE.json").read_text())
    mutant = data.draw(mutants(meta, "json"), label="mutant")
    note(f"COMPLETE.json: {mutant.how}")
    with tempfile.TemporaryDirectory(prefix="hppctl-fuzz-") as tmp:
        ck = damaged_copy(checkpoint, Path(tmp))
        (ck / ROUND / "COMPLETE.json").write_bytes(mutant.data)
        argv, outputs = resumer(ck, Path(tmp))
        assert_contract(invoke(argv), outputs)


def _meta(ck: Path) -> dict:
    return json.loads((ck / ROUND / "COMPLETE.json").read_text())


def _write_meta(ck: Path, meta) -> None:
    (ck / ROUND / "COMPLETE.json").write_text(json.dumps(meta))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _torch_edit(path: Path, edit) -> None:
    import torch

    state = torch.load(io.BytesIO(path.read_bytes()), weights_only=True)
    edit(state)
    buf = io.BytesIO()
    torch.save(state, buf)
    path.write_bytes(buf.getvalue())


def _nan_weights(state) -> None:
    for tensor in state["model"].values():
        if tensor.is_floating_point():
            tensor.fill_(float("nan"))


def _pickled_object(path: Path) -> None:
    path.write_bytes(pickle.dumps({"round": 1, "model": datetime.date(2020, 1, 1)}))


# Damage that the resume must refuse with exit 2 (issue 23, item 9), before any worker starts.
REFUSED = {
    "complete-json-truncated": lambda ck: _truncate(ck / ROUND / "COMPLETE.json"),
    "complete-json-a-list": lambda ck: _write_meta(ck, [_meta(ck)]),
    "complete-json-without-stages": lambda ck: _write_meta(ck, {k: v for k, v in _meta(ck).items() if k != "stages"}),
    "complete-json-without-plan": lambda ck: _write_meta(ck, {k: v for k, v in _meta(ck).items() if k != "plan"}),
    "complete-json-lineage-not-a-digest": lambda ck: _write_meta(ck, {**_meta(ck), "origin_plan": 5, "lost": "tx0"}),
    "complete-json-stages-out-of-range": lambda ck: _write_meta(ck, {**_meta(ck), "stages": [0, 1, 7]}),
    "complete-json-not-utf8": lambda ck: (ck / ROUND / "COMPLETE.json").write_bytes(b"\xff\xfe{}"),
    # found by the psl checkpoint's fuzzing: `--resume` read the recorded optimizer unchecked (KeyError, ValueError)
    "complete-json-without-lr": lambda ck: _write_meta(ck, {k: v for k, v in _meta(ck).items() if k != "lr"}),
    "complete-json-lr-text": lambda ck: _write_meta(ck, {**_meta(ck), "lr": "fast"}),
    "complete-json-momentum-past-float": lambda ck: _write_meta(ck, {**_meta(ck), "momentum": 10 ** 400}),
    "complete-json-schedule-a-number": lambda ck: _write_meta(ck, {**_meta(ck), "lr_schedule": 5}),
    "stage-file-truncated": lambda ck: _truncate(ck / ROUND / "stage-0.pt"),
    "stage-file-missing": lambda ck: (ck / ROUND / "stage-1.pt").unlink(),
    "stage-files-swapped": lambda ck: [(ck / ROUND / "stage-0.pt").rename(ck / ROUND / "x"),
                                       (ck / ROUND / "stage-1.pt").rename(ck / ROUND / "stage-0.pt"),
                                       (ck / ROUND / "x").rename(ck / ROUND / "stage-1.pt")],
    "stage-file-a-pickled-object": lambda ck: _pickled_object(ck / ROUND / "stage-0.pt"),
    "stage-file-nan-weights": lambda ck: _torch_edit(ck / ROUND / "stage-0.pt", _nan_weights),
}


@pytest.mark.parametrize("rounds", [2, 1], ids=["rounds-to-run", "nothing-to-run"])
@pytest.mark.parametrize("damage", sorted(REFUSED))
def test_a_damaged_checkpoint_is_refused_before_workers_start(checkpoint, tmp_path, damage, rounds):
    ck = damaged_copy(checkpoint, tmp_path)
    REFUSED[damage](ck)
    argv, outputs = resume(ck, tmp_path, rounds)
    assert_contract(invoke(argv), outputs, allowed={2})


def test_a_lock_symlink_does_not_truncate_its_target(checkpoint, tmp_path):
    """Issue 23, item 6: `LOCK` was opened following symlinks and truncated what it pointed to."""
    ck = damaged_copy(checkpoint, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (ck / "LOCK").unlink()
    (ck / "LOCK").symlink_to(victim)
    argv, outputs = resume(ck, tmp_path)
    outcome = invoke(argv)
    assert_contract(outcome, outputs, allowed={0, 2})
    assert victim.read_text() == "precious\n", outcome.describe()


def test_a_resume_refused_for_its_settings_leaves_no_metrics_file(checkpoint, tmp_path):
    """Found by the fuzz suite: the settings check runs inside the session, after `--metrics` was
    opened, so `--resume` with another --seed (or a COMPLETE.json whose dataset is NaN) exited 2
    and left an empty metrics file."""
    argv, outputs = resume(damaged_copy(checkpoint, tmp_path), tmp_path)
    assert_contract(invoke([*argv, "--seed", 1]), outputs, allowed={2})


# --- a psl run's checkpoint (every device's parts and optimizers: runtime/psl/checkpoint.py) --------------

PSL_PLAN = Path(__file__).parent / "seeds" / "psl-plan.yaml"


@pytest.fixture(scope="session")
def psl_checkpoint(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("psl-checkpoint") / "ck"
    made = invoke_subprocess(["psl", "run", "--plan", PSL_PLAN, "--cluster", PSL_CLUSTER, "--rounds", 1, "--threads", 1,
                              "--checkpoint-dir", where], gated=False, bound_s=120)
    assert made.code == 0 and (where / ROUND / "COMPLETE.json").exists(), made.describe()
    return where


def psl_resume(ck: Path, out: Path, rounds: int = 2) -> tuple[list, tuple[Path, ...]]:
    metrics = out / "metrics.jsonl"
    return (["psl", "run", "--plan", PSL_PLAN, "--cluster", PSL_CLUSTER, "--rounds", rounds, "--checkpoint-dir", ck,
             "--resume", "--metrics", metrics], (metrics,))


def test_the_psl_checkpoint_resumes_undamaged(psl_checkpoint, tmp_path):
    argv, outputs = psl_resume(damaged_copy(psl_checkpoint, tmp_path), tmp_path)
    assert_contract(invoke(argv), outputs, allowed={0})


@fuzz_settings(max_examples=30)
@given(data=st.data())
def test_a_mutated_psl_complete_json_keeps_the_contract(psl_checkpoint, data):
    resume_mutated_complete_json(psl_checkpoint, psl_resume, data)


def _nan_parts(state) -> None:
    for part in state["parts"].values():
        for tensor in part.values():
            if tensor.is_floating_point():
                tensor.fill_(float("nan"))


def _swap(ck: Path, a: str, b: str) -> None:
    (ck / ROUND / a).rename(ck / ROUND / "x")
    (ck / ROUND / b).rename(ck / ROUND / a)
    (ck / ROUND / "x").rename(ck / ROUND / b)


PSL_REFUSED = {
    "complete-json-a-training-plans": lambda ck: _write_meta(ck, {k: v for k, v in _meta(ck).items() if k != "kind"}),
    "complete-json-without-layout": lambda ck: _write_meta(ck, {k: v for k, v in _meta(ck).items() if k != "psl_layout"}),
    "complete-json-stages-of-fewer-devices": lambda ck: _write_meta(ck, {**_meta(ck), "stages": [0, 1]}),
    "device-file-truncated": lambda ck: _truncate(ck / ROUND / "stage-0.pt"),
    "device-file-missing": lambda ck: (ck / ROUND / "stage-1.pt").unlink(),
    "device-files-swapped": lambda ck: _swap(ck, "stage-0.pt", "stage-1.pt"),
    "device-file-a-pickled-object": lambda ck: _pickled_object(ck / ROUND / "stage-0.pt"),
    "device-file-nan-parts": lambda ck: _torch_edit(ck / ROUND / "stage-0.pt", _nan_parts),
}


@pytest.mark.parametrize("damage", sorted(PSL_REFUSED))
def test_a_damaged_psl_checkpoint_is_refused_before_workers_start(psl_checkpoint, tmp_path, damage):
    ck = damaged_copy(psl_checkpoint, tmp_path)
    PSL_REFUSED[damage](ck)
    argv, outputs = psl_resume(ck, tmp_path)
    assert_contract(invoke(argv), outputs, allowed={2})
