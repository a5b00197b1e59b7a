"""Progress lines and step reports (runtime/progress.py), with an injected clock: the interval logic,
the line format, the workers' bounded store reports; and `--log-every`'s refusals (issue 25, item 4)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from torch.distributed import HashStore

from hppctl.runtime.progress import (ProgressLog, StepProgress, StepReporter, Throttle, log_line,
                                     read_steps, report_every, slowest, utc_stamp)
from hppctl.runtime.results import evaluation_batches
from hppctl.runtime import wire


class Clock:
    def __init__(self, t: float = 1_795_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def parse(line: str) -> tuple[datetime, str]:
    stamp, text = line.split(" ", 1)
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc), text


def test_a_line_is_an_iso_utc_timestamp_then_the_text():
    assert utc_stamp(0) == "1970-01-01T00:00:00Z"
    when, text = parse(log_line(1_795_000_012.7, "round 12/40 loss 1.2340"))
    assert when == datetime.fromtimestamp(1_795_000_012, timezone.utc) and text == "round 12/40 loss 1.2340"


def test_phase_lines_at_start_and_end_and_one_per_interval_between():
    clock, lines = Clock(), []
    log = ProgressLog(lines.append, every=30, clock=clock)
    log.begin("training", "40 rounds")
    for r in range(1, 41):  # a round every 2 s: 80 s of training
        clock.advance(2)
        log.update(f"round {r}/40")
    log.end()
    texts = [parse(line)[1] for line in lines]
    assert texts == ["training: started (40 rounds)", "round 15/40", "round 30/40", "training: done in 80.0 s"]
    stamps = [parse(line)[0] for line in lines]
    assert [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:])] == [30, 30, 20]


def test_an_interval_without_news_repeats_the_status_or_the_elapsed_time():
    """The thread's `poll` keeps a log alive through a phase that blocks (a long batch, a model build)."""
    clock, lines = Clock(), []
    log = ProgressLog(lines.append, every=10, clock=clock)
    log.begin("workers", "3 workers")
    clock.advance(10)
    log.poll()
    log.update("started 3 workers")
    clock.advance(5)
    log.poll()  # not due: 5 s since the last line
    clock.advance(5)
    log.poll()
    assert [parse(line)[1] for line in lines] == ["workers: started (3 workers)", "workers: running for 10.0 s",
                                                 "started 3 workers"]


def test_no_interval_lines_between_phases_and_a_failed_phase_says_so():
    clock, lines = Clock(), []
    log = ProgressLog(lines.append, every=1, clock=clock)
    clock.advance(5)
    log.poll()
    assert lines == []
    log.begin("test pass", "9 batches")
    log.begin("saving")  # a new phase ends the one before
    clock.advance(0.5)
    log.end(failed=True)
    log.end()  # nothing open: no line
    assert [parse(line)[1] for line in lines] == ["test pass: started (9 batches)", "test pass: done in 0.0 s",
                                                 "saving: started", "saving: stopped after 0.5 s"]


def test_the_interval_thread_ends_the_phase_on_the_way_out():
    lines = []
    with pytest.raises(RuntimeError):
        with ProgressLog(lines.append, every=3600) as log:
            log.begin("training")
            raise RuntimeError("worker failed")
    assert parse(lines[-1])[1].startswith("training: stopped after ")


def test_throttle_is_due_once_per_interval():
    clock = Clock()
    throttle = Throttle(0.5, clock)
    due = []
    for _ in range(10):  # 0.2 s apart: due at 0, 0.6, 1.2, 1.8
        due.append(throttle.due())
        clock.advance(0.2)
    assert due == [True, False, False, True, False, False, True, False, False, True]


def test_a_worker_overwrites_one_key_at_most_every_interval_and_at_a_rounds_end():
    store, clock = HashStore(), Clock()
    reporter = StepReporter(store, "w0", "micro-batches", every=0.5, clock=clock)
    written = []
    for m in range(1, 23):  # 22 micro-batches, 1/8 s apart (exact in binary)
        clock.advance(0.125)
        reporter.report(3, m, 22)
        key = wire.progress("w0")
        written.append(StepProgress.from_json(store.get(key)).done if store.check([key]) else None)
    # every 0.5 s from the reporter's making (not at once), then the round's end; one key throughout
    assert written == [None] * 3 + [4] * 4 + [8] * 4 + [12] * 4 + [16] * 4 + [20, 20, 22]
    assert read_steps(store, ["w0", "w1"]) == {"w0": StepProgress(3, 22, 22, "micro-batches")}


def test_the_launcher_shows_the_slowest_device_of_the_running_round():
    a, b = StepProgress(2, 30, 88, "micro-batches"), StepProgress(2, 10, 88, "micro-batches")
    assert slowest({"a": a, "b": b}, 2) == b and b.position() == pytest.approx(2 + 10 / 88)
    assert slowest({"a": a, "b": StepProgress(1, 88, 88, "micro-batches")}, 2) is None  # b has not reported round 2
    assert StepProgress.from_json(a.to_json()) == a and a.step_name() == "micro-batch"
    assert StepProgress(0, 1, 3, "passes").step_name() == "pass"


def test_workers_report_as_often_as_the_log_writes_but_at_most_every_half_second():
    assert report_every(None) == 0.5 and report_every(30) == 0.5 and report_every(0.2) == 0.2


def test_test_batches_counts_the_last_partial_batch():
    assert evaluation_batches(range(360)) == 2 and evaluation_batches(range(256)) == 1 and evaluation_batches(range(257)) == 2


# --- the flag ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from hppctl.cli import run
    from tests.conftest import make_profile
    from tests.runtime.factories import local_cluster, make_plan
    from hppctl.store import save

    tmp = tmp_path_factory.mktemp("log-every")
    save(tmp / "p.json", make_profile(layers=5, speeds=(1, 2, 3)))
    save(tmp / "train.yaml", make_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])],
                                       global_batch=16, micro_batch=4))
    save(tmp / "c.yaml", local_cluster("a", "b"))
    assert run(["psl", "plan", "--profile", str(tmp / "p.json"), "--clients", "dev0,dev1", "--helpers", "dev2",
                "--cut", "2,4", "--batch", "8", "--out", str(tmp / "psl.yaml")]) == 0
    return tmp


@pytest.mark.parametrize("command", ["run", "psl run", "demo", "run on a psl plan"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "-inf", "0.001", "1e300"])
def test_log_every_refuses_what_is_not_an_interval_in_one_line(cli, files, tmp_path, command, value):
    argv = {"run": ["run", "--plan", files / "train.yaml", "--cluster", files / "c.yaml"],
            "run on a psl plan": ["run", "--plan", files / "psl.yaml", "--cluster", files / "c.yaml"],
            "psl run": ["psl", "run", "--plan", files / "psl.yaml", "--cluster", files / "c.yaml"],
            "demo": ["demo", "--out-dir", tmp_path / "demo"]}[command]
    code, out, err = cli(*argv, "--log-every", value)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: --log-every: must be a number of seconds from 0.01 to 2592000"), err


def test_a_galaxy_device_reports_every_pass_warm_up_included():
    """What the worker's step reports count (one device: no process group needed)."""
    import torch

    from hppctl.runtime.galaxy.device import run_device
    from hppctl.runtime.galaxy.weights import device_shard, extract
    from tests.galaxy.factories import hf_model

    weights = extract(hf_model("gpt2", seed=0), "gpt2")
    shard = device_shard(weights, (0, weights["meta"]["heads"]), (0, 4 * weights["meta"]["hidden"]))
    passes = []
    _, timings = run_device("local", shard, torch.arange(9), 0, [9], overlap=False, repeats=2, warmup=1,
                            on_pass=lambda done, total: passes.append((done, total)))
    assert passes == [(1, 3), (2, 3), (3, 3)] and len(timings) == 2
