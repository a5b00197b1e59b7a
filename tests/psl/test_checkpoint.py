"""PSL runs write checkpoints and resume from them (`hppctl psl run --checkpoint-dir … --resume`,
`--more-rounds`); refused before (exit 2: "which keeps no checkpoint to resume from"). A resumed run
ends with the uninterrupted run's parameters: every device's parts and optimizer state carry over
(Adam here: without its moments the resumed run differs). A checkpoint this run cannot resume is
refused before any worker starts, with one line naming the file, and nothing written. The SIGKILL
case: tests/runtime/test_schedule_matrix.py (psl × resume after SIGKILL)."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path

import pytest
import torch

from hppctl.cli import run
from hppctl.runtime.checkpoint import COMPLETE, CheckpointDir

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(600)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CLUSTER = EXAMPLES / "psl-cluster.yaml"
SETTINGS = ["--dataset", "digits", "--local-batches", "2", "--shares", "2,1,1", "--threads", "1", "--seed", "5"]


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("psl") / "psl.yaml"
    assert run(["psl", "plan", "--spec", str(EXAMPLES / "psl.yaml"), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def written(plan, tmp_path_factory) -> Path:
    """A checkpoint directory a real 2-round run wrote (rounds 1 and 2), and its model beside it (model.pt)."""
    ck = tmp_path_factory.mktemp("written") / "ck"
    assert run(["psl", "run", "--plan", str(plan), "--cluster", str(CLUSTER), *SETTINGS, "--rounds", "2",
                "--checkpoint-dir", str(ck), "--save-model", str(ck.parent / "model.pt")]) == 0
    assert CheckpointDir(ck).complete_rounds() == [1, 2]
    return ck


def psl_run(cli, plan: Path, *flags) -> tuple[int, str, str]:
    return cli("psl", "run", "--plan", plan, "--cluster", CLUSTER, *SETTINGS, *flags)


def test_two_cron_starts_of_more_rounds_end_with_the_uninterrupted_runs_parameters(cli, plan, tmp_path):
    code, _, err = psl_run(cli, plan, "--rounds", "4", "--save-model", tmp_path / "whole.pt")
    assert code == 0, err
    for start, order in ((0, "plan"), (2, "ltf")):  # a cron line; --order is not recorded: it changes no number
        code, out, err = psl_run(cli, plan, "--checkpoint-dir", tmp_path / "ck", "--resume", "--more-rounds", "2",
                                 "--metrics", tmp_path / "m.jsonl", "--save-model", tmp_path / "resumed.pt", "--json",
                                 "--order", order)
        assert code == 0, err
        summary = json.loads(out)
        assert (summary["start_round"], summary["rounds_run"]) == (start, 2)
        # The log says what this start runs (it said "4 rounds" on the second start before).
        assert f"training: started ({'2 rounds' if start == 0 else 'rounds 3-4 of 4'})" in err, err
    whole, resumed = torch.load(tmp_path / "whole.pt"), torch.load(tmp_path / "resumed.pt")
    assert sorted(whole) == sorted(resumed)
    for name in whole:
        torch.testing.assert_close(resumed[name], whole[name], rtol=0, atol=0, msg=lambda m: f"{name}: {m}")
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == [0, 1, 2, 3]  # appended to on --resume
    assert CheckpointDir(tmp_path / "ck").complete_rounds() == [3, 4]


def refusal(cli, plan, ck: Path, tmp_path: Path, *flags) -> str:
    """Resume from `ck`: exit 2, one `error:` line and nothing else, no metrics file, `ck` unchanged."""
    before = sorted((p.relative_to(ck), p.read_bytes()) for p in ck.rglob("*") if p.is_file() and p.name != "LOCK")
    code, out, err = psl_run(cli, plan, "--checkpoint-dir", ck, "--resume", "--metrics", tmp_path / "m.jsonl", *flags)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: --"), (code, out, err)
    assert not (tmp_path / "m.jsonl").exists()
    assert sorted((p.relative_to(ck), p.read_bytes()) for p in ck.rglob("*") if p.is_file() and p.name != "LOCK") == before
    return lines[0]


def copy_of(written: Path, tmp_path: Path) -> Path:
    ck = tmp_path / "ck"
    shutil.copytree(written, ck)
    return ck


def rewrite_device_file(ck: Path, rank: int, state: dict) -> None:
    """Replace round 2's file of `rank` and record its digest, as if a run had written it."""
    where = ck / "round-00000002"
    torch.save(state, buf := io.BytesIO())
    (where / f"stage-{rank}.pt").write_bytes(buf.getvalue())
    meta = json.loads((where / COMPLETE).read_text())
    meta["sha256"][f"stage-{rank}.pt"] = hashlib.sha256(buf.getvalue()).hexdigest()
    (where / COMPLETE).write_text(json.dumps(meta))


def device_state(ck: Path, rank: int) -> dict:
    return torch.load(ck / "round-00000002" / f"stage-{rank}.pt", weights_only=True)


def test_other_settings_are_refused_naming_the_record(cli, plan, written, tmp_path):
    line = refusal(cli, plan, copy_of(written, tmp_path), tmp_path, "--rounds", "3", "--shares", "1,1,1")
    assert line == (f"error: --resume: {tmp_path / 'ck' / 'round-00000002' / COMPLETE}: shares is [2.0, 1.0, 1.0], "
                    f"this run has [1.0, 1.0, 1.0]; resume with the same settings or use another --checkpoint-dir")


def test_a_plan_of_another_layout_is_refused(cli, plan, written, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text((EXAMPLES / "psl.yaml").read_text().replace("cut: [3, 8]", "cut: [2, 8]"))
    other = tmp_path / "other.yaml"
    assert cli("psl", "plan", "--spec", spec, "--out", other)[0] == 0
    line = refusal(cli, other, copy_of(written, tmp_path), tmp_path, "--rounds", "3")
    assert ": psl_layout is 'tiny-cnn fine batch 16: pi0 [3, 8] on " in line and "this run has 'tiny-cnn fine batch 16: " \
        "pi0 [2, 8] on " in line, line


def test_a_round_that_leaves_nothing_to_run_tests_and_saves_the_checkpoints_model(cli, plan, written, tmp_path):
    """As `hppctl run` does: exit 0 with a note, no worker started, the checkpoint's model tested and saved."""
    code, out, err = psl_run(cli, plan, "--rounds", "2", "--checkpoint-dir", copy_of(written, tmp_path), "--resume",
                             "--save-model", tmp_path / "model.pt", "--trace", tmp_path / "t.json", "--json")
    assert code == 0, err
    assert "the checkpoint already holds round 2 of 2; nothing to run (--more-rounds K trains K rounds more)" in err
    summary = json.loads(out)
    assert (summary["start_round"], summary["rounds_run"], summary["batch_makespan_s"]) == (2, 0, None)
    assert 0 <= summary["test_accuracy"] <= 1 and summary["trace"] is None and not (tmp_path / "t.json").exists()
    assert "stem.0.weight" in torch.load(tmp_path / "model.pt", weights_only=True)
    code, out, err = psl_run(cli, plan, "--rounds", "2", "--checkpoint-dir", tmp_path / "ck", "--resume")
    assert code == 0 and "psl run: tiny-cnn, 3 clients, 2 helpers" in out and "0 rounds" in out and "test accuracy" in out


def test_a_training_plans_checkpoint_is_refused_and_a_psl_one_by_a_training_plan(cli, plan, written, tmp_path):
    ck = copy_of(written, tmp_path)
    code, out, err = cli("run", "--plan", EXAMPLES / "plan-local.yaml", "--cluster", EXAMPLES / "local.yaml",
                         "--dataset", "digits", "--rounds", "3", "--checkpoint-dir", ck, "--resume")
    assert code == 2 and out == "" and err.strip() == (
        f"error: --resume: {ck / 'round-00000002' / COMPLETE}: written by a psl plan's run (`hppctl psl run`); this "
        f"is a training plan's run (`hppctl run`), which cannot start from its files: give another directory"), err
    meta = json.loads((ck / "round-00000002" / COMPLETE).read_text())
    del meta["kind"]  # what a training plan's run records
    (ck / "round-00000002" / COMPLETE).write_text(json.dumps(meta))
    line = refusal(cli, plan, ck, tmp_path, "--rounds", "3")
    assert line.endswith(": written by a training plan's run (`hppctl run`); this is a psl plan's run "
                         "(`hppctl psl run`), which cannot start from its files: give another directory"), line


def test_an_unknown_kind_is_refused_naming_the_field(cli, plan, written, tmp_path):
    ck = copy_of(written, tmp_path)
    meta = json.loads((ck / "round-00000002" / COMPLETE).read_text())
    (ck / "round-00000002" / COMPLETE).write_text(json.dumps({**meta, "kind": {"nested": 1}}))
    line = refusal(cli, plan, ck, tmp_path, "--rounds", "3")
    assert line == (f"error: --resume: {ck / 'round-00000002' / COMPLETE}: kind: must be one of hpp, psl "
                    f"(got {{'nested': 1}})"), line


def test_a_device_file_holding_another_devices_parts_is_refused(cli, plan, written, tmp_path):
    ck = copy_of(written, tmp_path)
    rewrite_device_file(ck, 0, device_state(ck, 3))  # client pi0's file now holds helper lap's copies
    line = refusal(cli, plan, ck, tmp_path, "--rounds", "3")
    assert line.startswith(f"error: --resume: {ck / 'round-00000002' / 'stage-0.pt'}: parts: ") \
        and line.endswith(", where pi0 holds part1, part3"), line


def test_a_part_of_the_wrong_shape_or_not_finite_is_refused(cli, plan, written, tmp_path):
    ck = copy_of(written, tmp_path)
    state = device_state(ck, 1)
    name = next(iter(state["parts"]["part1"]))
    good = state["parts"]["part1"][name]
    state["parts"]["part1"][name] = torch.zeros(good.numel() + 1)
    rewrite_device_file(ck, 1, state)
    line = refusal(cli, plan, ck, tmp_path, "--rounds", "3")
    assert f"stage-1.pt: parts.part1.{name}: shape ({good.numel() + 1},), the plan's part has {tuple(good.shape)}" \
        in line, line
    state["parts"]["part1"][name] = torch.full_like(good, float("nan"))
    rewrite_device_file(ck, 1, state)
    line = refusal(cli, plan, ck, tmp_path, "--rounds", "3")
    assert line.endswith(f"stage-1.pt: parts.part1.{name} holds NaN or infinity"), line


def test_a_device_file_that_is_not_a_state_is_refused(cli, plan, written, tmp_path):
    ck = copy_of(written, tmp_path)
    rewrite_device_file(ck, 4, [1, 2, 3])  # type: ignore[arg-type]
    line = refusal(cli, plan, ck, tmp_path, "--rounds", "3")
    assert line.endswith("stage-4.pt: not a PSL device state (a list)"), line


@pytest.mark.parametrize("command", [["psl", "run"], ["run"]])
@pytest.mark.parametrize("flags, line", [
    (["--resume"], "error: --resume: needs --checkpoint-dir"),
    (["--checkpoint-every", "2"], "error: --checkpoint-every: needs --checkpoint-dir"),  # was ignored
    (["--more-rounds", "2"], "error: --more-rounds: goes with --resume and --checkpoint-dir (it counts past the "
                             "newest round there)"),
])
def test_checkpoint_flags_without_a_directory_are_refused(cli, plan, command, flags, line):
    code, out, err = cli(*command, "--plan", plan, "--cluster", CLUSTER, *flags)
    assert (code, out, err.strip()) == (2, "", line)


def test_a_training_plan_refuses_checkpoint_every_without_a_directory(cli):
    """It trained without a checkpoint and said nothing."""
    code, out, err = cli("run", "--plan", EXAMPLES / "plan-local.yaml", "--cluster", EXAMPLES / "local.yaml",
                         "--checkpoint-every", "2")
    assert (code, out, err.strip()) == (2, "", "error: --checkpoint-every: needs --checkpoint-dir")


def test_an_optimizer_state_that_does_not_fit_its_parameters_is_refused(cli, plan, written, tmp_path):
    """Adam would load it and fail at its first step, in a worker, after every process started."""
    ck = copy_of(written, tmp_path)
    state = device_state(ck, 3)  # helper lap: one optimizer per client copy
    client, optimizer = next(iter(state["optimizers"].items()))
    optimizer["state"][0]["exp_avg"] = torch.zeros(3, 3, 3)
    rewrite_device_file(ck, 3, state)
    line = refusal(cli, plan, ck, tmp_path, "--rounds", "3")
    assert "stage-3.pt: optimizer.state.0.exp_avg (for " in line and "has shape [3, 3, 3]" in line, line


def test_init_from_a_saved_model_starts_every_part_from_it(cli, plan, tmp_path):
    """`--init-from` (refused for psl plans before): the run equals the single-process reference
    started from the same weights."""
    from hppctl.models.psl import PslPlan
    from hppctl.runtime.config import TrainOptions
    from hppctl.runtime.psl.config import PslOptions
    from hppctl.store import load
    from hppctl.zoo import get_model
    from tests.psl.reference import psl_reference

    psl = load(plan, PslPlan)
    trained = get_model(psl.model).build(seed=99).train().state_dict()  # the wrapper's names: "model.…"
    torch.save({k.removeprefix("model."): v for k, v in trained.items()}, tmp_path / "trained.pt")
    code, _, err = psl_run(cli, plan, "--rounds", "2", "--init-from", tmp_path / "trained.pt",
                           "--save-model", tmp_path / "out.pt")
    assert code == 0, err
    options = PslOptions(train=TrainOptions(rounds=2, dataset="digits", seed=5, optimizer="adam", lr=0.02),
                         local_batches=2, shares=[2.0, 1.0, 1.0])
    expected = psl_reference(psl.model, psl.batch, len(psl.clients), options, initial=trained)[0]
    torch.testing.assert_close(torch.load(tmp_path / "out.pt", weights_only=True),
                               {k.removeprefix("model."): v for k, v in expected.items()}, rtol=1e-4, atol=1e-5)


def test_init_from_a_psl_checkpoint_directory_is_the_model_its_run_saved(written):
    """Its devices' parts joined (after FedAvg every copy holds the average) are the `--save-model` file
    of the run that wrote it; refused before, naming that file. A model of another name is refused."""
    from hppctl.errors import BadInput
    from hppctl.runtime.warmstart import load_initial_state

    joined, saved = load_initial_state(written, "tiny-cnn"), load_initial_state(written.parent / "model.pt", "tiny-cnn")
    assert sorted(joined) == sorted(saved)
    for name in saved:
        torch.testing.assert_close(joined[name], saved[name], rtol=0, atol=0, msg=lambda m: f"{name}: {m}")
    with pytest.raises(BadInput, match=r"^--init-from: .*round-00000002/COMPLETE.json: psl_layout: 'tiny-cnn fine "
                                       r"batch 16: .* trained 'tiny-cnn', this run trains 'tiny-mlp'$"):
        load_initial_state(written, "tiny-mlp")


def test_a_round_written_after_more_rounds_was_counted_is_refused_as_locked(plan, written, tmp_path):
    """`--more-rounds` counts from the newest round before the lock is held; a run that wrote a newer
    round meanwhile makes this one stop (exit 75, try again), as `hppctl run` does."""
    from hppctl.models.cluster import ClusterSpec
    from hppctl.models.psl import PslPlan
    from hppctl.runtime.checkpoint import CheckpointLocked
    from hppctl.runtime.config import TrainOptions
    from hppctl.runtime.psl.config import PslOptions
    from hppctl.runtime.psl.session import PslRunRequest, PslSession
    from hppctl.store import load

    options = PslOptions(train=TrainOptions(dataset="digits", seed=5, rounds=4, optimizer="adam", lr=0.02),
                         local_batches=2, shares=[2.0, 1.0, 1.0])
    session = PslSession(PslRunRequest(load(plan, PslPlan), load(CLUSTER, ClusterSpec), options,
                                       checkpoint_dir=copy_of(written, tmp_path), resume=True, expected_start=1))
    with pytest.raises(CheckpointLocked, match="another run wrote round 2 after this one counted its rounds from "
                                               "round 1; try again"):
        session.resume_point()
