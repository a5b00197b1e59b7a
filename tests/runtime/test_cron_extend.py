"""Issue 25 item 8: `--resume --more-rounds N` trains N rounds past the newest complete round, so one
command continues a run each time it starts; under a schedule each extension is one cycle over its own
N rounds (docs/runtime.md, "Scheduled retraining (cron)"). Before, a run could only be continued by
raising `--rounds` by hand, and a cosine run not at all (its total rounds are part of its schedule).
"""

from __future__ import annotations

import json
import math

import pytest

from hppctl.models.cluster import ClusterSpec
from hppctl.models.plan import HppPlan
from hppctl.runtime.checkpoint import COMPLETE, CheckpointLocked
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.session import RunRequest, Session
from hppctl.store import load, save
from tests.runtime.factories import local_cluster, make_plan

DATASET = "tests.runtime.userdata:slow_features"


def documented_rate(r: int, *, start: int, n: int, lr: float, warmup: int) -> float:
    """docs/runtime.md: round r of a cosine cycle of n rounds begun at round `start`, after `warmup`."""
    step = r - start
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (n - warmup)))


def test_an_extension_takes_the_rates_of_a_run_of_its_own_length():
    extension = TrainOptions(rounds=30, schedule_start=20, lr=0.1, lr_schedule="cosine", warmup_rounds=2)
    alone = TrainOptions(rounds=10, lr=0.1, lr_schedule="cosine", warmup_rounds=2)
    for r in range(20, 30):
        assert extension.learning_rate(r) == pytest.approx(alone.learning_rate(r - 20))
        assert extension.learning_rate(r) == pytest.approx(documented_rate(r, start=20, n=10, lr=0.1, warmup=2))
    constant = TrainOptions(rounds=30, schedule_start=20, lr=0.1)
    assert {constant.learning_rate(r) for r in range(20, 30)} == {0.1}


@pytest.fixture
def files(tmp_path):
    save(tmp_path / "plan.yaml", make_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])],
                                           global_batch=16, micro_batch=4))
    save(tmp_path / "cluster.yaml", local_cluster("a", "b"))
    return ["run", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "cluster.yaml", "--dataset", DATASET,
            "--threads", "1"]


@pytest.mark.parametrize("flags, message", [
    (["--more-rounds", "5"], "--more-rounds: goes with --resume and --checkpoint-dir"),
    (["--more-epochs", "2", "--checkpoint-dir", "CK"], "--more-epochs: goes with --resume"),
    (["--more-rounds", "5", "--rounds", "10", "--resume", "--checkpoint-dir", "CK"],
     "--more-rounds: counts past the checkpoint's newest round; --rounds gives the total instead"),
    (["--more-epochs", "1", "--epochs", "1", "--resume", "--checkpoint-dir", "CK"],
     "--more-epochs: counts past the checkpoint's newest round; --epochs gives the total instead"),
    (["--more-rounds", "5", "--more-epochs", "1", "--resume", "--checkpoint-dir", "CK"],
     "--more-rounds and --more-epochs: give one of them"),
    (["--more-rounds", "0", "--resume", "--checkpoint-dir", "CK"], "--more-rounds"),
    (["--more-rounds", "5", "--schedule", "nf1b", "--resume", "--checkpoint-dir", "CK"],
     "--more-rounds: --schedule nf1b trains whole epochs; use --more-epochs"),
    (["--more-rounds", "3", "--warmup-rounds", "3", "--resume", "--checkpoint-dir", "CK"],
     "--warmup-rounds: 3 leaves none of the run's 3 rounds at --lr"),
])
def test_nonsense_combinations_are_refused(cli, files, tmp_path, flags, message):
    flags = [str(tmp_path / "ck") if f == "CK" else f for f in flags]
    code, out, err = cli(*files, *flags)
    assert code == 2, err
    assert err.strip().startswith(f"error: {message}"), err
    assert len(err.strip().splitlines()) == 1 and out == ""
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir())


@pytest.mark.gloo
@pytest.mark.timeout(600)
def test_a_cosine_run_extended_twice_restarts_its_cycle(cli, files, tmp_path):
    n, lr, warmup = 4, 0.05, 1
    command = [*files, "--checkpoint-dir", tmp_path / "ck", "--resume", "--more-rounds", str(n), "--optimizer", "sgd", "--lr", str(lr),
               "--lr-schedule", "cosine", "--warmup-rounds", str(warmup), "--metrics", tmp_path / "m.jsonl", "--json"]
    for day in (1, 2):
        code, out, err = cli(*command)
        assert code == 0, err
        summary = json.loads(out)
        assert (summary["start_round"], summary["rounds"], summary["rounds_run"]) == ((day - 1) * n, day * n, n)
        meta = json.loads((tmp_path / "ck" / f"round-{day * n:08d}" / COMPLETE).read_text())
        cycle = f", cycle from round {(day - 1) * n}" if day > 1 else ""
        assert meta["lr_schedule"] == f"cosine, {day * n} rounds, {warmup} warm-up rounds{cycle}"

    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == list(range(2 * n))
    for row in rows:
        start = row["round"] // n * n
        assert row["lr"] == pytest.approx(documented_rate(row["round"], start=start, n=n, lr=lr, warmup=warmup))
    assert rows[n]["lr"] == pytest.approx(rows[0]["lr"])  # a warm restart, not a jump into a stretched curve

    # continuing that round with a total instead is refused: its schedule is not the one recorded
    code, out, err = cli(*[a for a in command if a not in ("--more-rounds", str(n))], "--rounds", str(3 * n))
    assert code == 2, err
    assert "lr_schedule is 'cosine, 8 rounds, 1 warm-up rounds, cycle from round 4'" in err

    # a start that counted its rounds from round 4 while another run went on to write round 8: once it
    # holds the lock it sees round 8, and stops as if the lock were still held (exit 75), starting nothing
    options = TrainOptions(dataset=DATASET, rounds=4 + n, schedule_start=4, lr=lr, lr_schedule="cosine",
                           warmup_rounds=warmup)
    late = Session(RunRequest(load(tmp_path / "plan.yaml", HppPlan), load(tmp_path / "cluster.yaml", ClusterSpec),
                              options, checkpoint_dir=tmp_path / "ck", resume=True, expected_start=4))
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "ck").rglob("*.pt"))
    with pytest.raises(CheckpointLocked, match="another run wrote round 8 after this one counted its rounds from "
                                               "round 4"):
        late.run()
    assert not late.workers
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "ck").rglob("*.pt")) == before
