"""Issue 26 item 3: the coordinator's fault-tolerance documents are typed and versioned records, read
by the workers field by field — a document with a missing field, a wrong type or another version is
refused where it is read, not discovered as a KeyError mid-recovery."""

import json

import pytest
from pydantic import ValidationError

from hppctl.models.ft_documents import GatherPlan, Reconfiguration, Transfer, Upload
from hppctl.schedule import schedule_for_plan
from tests.runtime.factories import make_plan


@pytest.fixture
def plan():
    return make_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 5), ["c"], [4])], global_batch=8, micro_batch=4)


def light(plan) -> Reconfiguration:
    return Reconfiguration(resume_round=3, layout=1, lost=["b"], method="light", plan=plan,
                           schedule=schedule_for_plan(plan), moved_bytes=1024,
                           migrations=[Transfer(device="a", start=2, end=3, source="c", backup_of="b")], helpers=[])


def test_a_reconfiguration_crosses_the_store_unchanged(plan):
    doc = light(plan)
    back = Reconfiguration.model_validate_json(doc.model_dump_json())
    assert back == doc and back.version == 1 and back.migrations[0].backup_of == "b"
    gather = GatherPlan(resume_round=3, layout=1, uploads={"0": Upload(device="a"), "1": Upload(device="c", backup_of="b")})
    assert GatherPlan.model_validate_json(gather.model_dump_json()) == gather


@pytest.mark.parametrize("change", [
    lambda d: d.pop("resume_round"),
    lambda d: d.update(version=2),
    lambda d: d.update(method="medium"),
    lambda d: d.update(moved_bytes="1024"),
    lambda d: d["migrations"][0].pop("source"),
    lambda d: d.update(extra_field=1),
])
def test_a_document_a_worker_cannot_trust_is_refused(plan, change):
    doc = json.loads(light(plan).model_dump_json())
    change(doc)
    with pytest.raises(ValidationError):
        Reconfiguration.model_validate_json(json.dumps(doc))


def test_a_malformed_stall_inventory_is_that_devices_failure_in_one_line(plan):
    """`stall/<gen>/<device>` is an `Inventory` (models/reports.py): one the coordinator cannot read as
    such fails the run naming the device, before any re-planning reads it key by key."""
    from types import SimpleNamespace

    from torch.distributed import HashStore

    from hppctl.models.reports import Inventory
    from hppctl.runtime import wire
    from hppctl.runtime.config import TrainOptions
    from hppctl.runtime.launcher import WorkerFailed
    from hppctl.runtime.ft_session import RecoveryOptions, FtSession
    from hppctl.runtime.session import RunRequest
    from tests.runtime.factories import local_cluster

    session = FtSession(RunRequest(plan, local_cluster("a", "c"), TrainOptions(rounds=4)),
                               RecoveryOptions(profile=None, stall_timeout_s=5.0))
    session.store = SimpleNamespace(store=HashStore(), token="t" * 64)
    session.detector.listen("127.0.0.1", "t" * 64, {"a": {"127.0.0.1"}, "c": {"127.0.0.1"}})
    try:
        session.detector.arm(["a", "c"])
        store = session.store.store
        store.set(wire.stall(1, "a"), Inventory(layout=0, snapshots=[2, 3]).model_dump_json())
        store.set(wire.stall(1, "c"), '{"layout": 0, "snapshots": "3"}')
        with pytest.raises(WorkerFailed) as caught:
            session._collect(1, ["a", "c"], [])
    finally:
        session.detector.stop()
    message = str(caught.value)
    assert message.startswith("worker on device c sent a malformed 'stall/1/c'") and "snapshots" in message
    assert "\n" not in message
