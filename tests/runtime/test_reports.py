"""Issue 26: what workers report through the run's store is typed (models/reports.py) — a round
report, a PSL round report, a stall inventory — and a document the launcher cannot read as one is
that device's failure, one line naming it, never a KeyError traceback from the launcher."""

import json
from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from torch.distributed import HashStore

from hppctl.models.reports import Inventory, PslRoundReport, RoundReport, StateSizes
from hppctl.runtime import wire
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.launcher import WorkerFailed
from hppctl.runtime.session import RunRequest, Session
from tests.runtime.factories import local_cluster, make_plan


def report(device: str, stage: int, **changes) -> RoundReport:
    fields = dict(round=0, device=device, stage=stage, started_at=1000.0, duration_s=0.5, compute_s=0.3, wait_s=0.1,
                  allreduce_s=0.0, step_s=0.01, cpu_s=0.4, bytes_sent=4096, loss=0.0, correct=0, samples=0,
                  rss_bytes=10, peak_rss_bytes=20, baseline_rss_bytes=5, host="h", cgroup="/", lr=0.05)
    return RoundReport(**{**fields, **changes})


@pytest.fixture
def session():
    plan = make_plan("tiny-mlp", [((0, 2), ["a"], [8]), ((2, 5), ["b"], [8])], global_batch=8, micro_batch=8)
    options = TrainOptions(rounds=2)
    s = Session(RunRequest(plan, local_cluster("a", "b"), options))
    s.store = SimpleNamespace(store=HashStore())
    s.loop.start(options, 0, None, 1, None)
    return s


def test_a_round_of_typed_reports_becomes_its_row(session):
    store = session.store.store
    store.set(wire.metrics(0, "a"), report("a", 0).model_dump_json())
    store.set(wire.metrics(0, "b"), report("b", 1, loss=1.5, correct=6, samples=8).model_dump_json())
    session._consume_reports(2)
    [row] = session.loop.rows
    assert row["loss"] == 1.5 and row["train_accuracy"] == 0.75 and row["lr"] == 0.05
    assert session.loop.memory["b"] == {"rss_bytes": 10, "peak_rss_bytes": 20, "baseline_rss_bytes": 5, "host": "h",
                                        "cgroup": "/"}


def test_a_diverged_loss_crosses_the_store_as_a_number():
    """A NaN loss written as JSON null was refused as malformed: a diverged PSL run exited 1, not 4."""
    back = RoundReport.model_validate_json(report("b", 1, loss=float("nan")).model_dump_json())
    assert back.loss != back.loss
    assert RoundReport.model_validate_json(report("b", 1, loss=float("inf")).model_dump_json()).loss == float("inf")


@pytest.mark.parametrize("bad, field", [
    ('{"round": 0, "device": "b"}', "rss_bytes"),                           # another build's report
    (json.dumps({**json.loads(report("b", 1).model_dump_json()), "version": 2}), "version"),
    (json.dumps({**json.loads(report("b", 1).model_dump_json()), "loss": "1.5"}), "loss"),
    ("not json", "(top level)"),
])
def test_a_malformed_round_report_is_that_devices_failure_in_one_line(session, bad, field):
    store = session.store.store
    store.set(wire.metrics(0, "a"), report("a", 0).model_dump_json())
    store.set(wire.metrics(0, "b"), bad)
    with pytest.raises(WorkerFailed) as caught:
        session._consume_reports(2)
    message = str(caught.value)
    assert message.startswith("worker on device b sent a malformed 'metrics/0/b'") and field in message
    assert "\n" not in message


def test_an_inventory_crosses_the_store_unchanged_and_a_foreign_one_is_refused():
    previous = Inventory(layout=0, snapshots=[3, 4], backups={"c": [4]},
                         state_bytes=StateSizes(own={"4": {"0.weight": 16}}, backups={"c": {"4": {"3.weight": 8}}}))
    inventory = Inventory(layout=1, snapshots=[4], previous=previous)
    assert Inventory.model_validate_json(inventory.model_dump_json()) == inventory
    doc = json.loads(inventory.model_dump_json())
    doc["snapshots"] = ["4"]
    with pytest.raises(ValidationError):
        Inventory.model_validate_json(json.dumps(doc))


def test_a_psl_report_keeps_its_batches_typed_by_role():
    base = dict(round=0, device="h0", role="helper", started_at=1.0, duration_s=1.0, cpu_s=1.0, fedavg_s=0.1,
                rss_bytes=1, peak_rss_bytes=2, host="h", cgroup="/")
    helper = PslRoundReport.model_validate({**base, "batches": [{"step": 0, "tasks": [["F", "c0", 0.0, 0.1, 0.0]]}]},
                                           strict=False)
    back = PslRoundReport.model_validate_json(helper.model_dump_json())
    assert back == helper and back.batches[0].tasks[0][:2] == ("F", "c0")
    assert helper.memory() == {"rss_bytes": 1, "peak_rss_bytes": 2, "host": "h", "cgroup": "/"}
