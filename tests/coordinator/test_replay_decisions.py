"""Pure: where a pipeline replay restarts (coordinator/replay.py)."""

import pytest

from hppctl.coordinator.replay import resume_round, transfer_plan, upload_plan
from hppctl.errors import RuntimeFailure
from tests.runtime.factories import make_plan

THREE = [["a"], ["b"], ["c"]]


def inventory(snapshots, backups=None):
    return {"snapshots": list(snapshots), "backups": backups or {}}


def test_resume_is_the_newest_round_every_stage_can_restore():
    inventories = {"a": inventory([5, 6, 7]), "c": inventory([4, 5, 6], {"b": [5, 6]})}
    assert resume_round(THREE, "b", inventories) == 6


def test_a_lost_single_device_stage_needs_its_backup():
    inventories = {"a": inventory([5, 6, 7]), "c": inventory([5, 6, 7], {"b": [4, 5]})}
    assert resume_round(THREE, "b", inventories) == 5


def test_a_leaver_reports_its_own_snapshots_and_needs_no_backup():
    inventories = {"a": inventory([5, 6, 7]), "b": inventory([5, 6, 7]), "c": inventory([5, 6, 7])}
    assert resume_round(THREE, "b", inventories, leaving=True) == 7


def test_snapshots_of_rounds_not_yet_reported_are_not_candidates():
    # A worker snapshots round 7 before it reports round 6 (the backup exchange comes in between): a
    # re-plan that interrupts it there leaves round 6 unreported. Resuming at 7 skipped round 6's row
    # and the launcher waited for it forever (the intermittent hang of the SIGTERM replay test).
    inventories = {"a": inventory([5, 6, 7]), "b": inventory([5, 6, 7]), "c": inventory([5, 6, 7])}
    assert resume_round(THREE, "b", inventories, leaving=True, reported=6) == 6
    assert resume_round(THREE, "b", inventories, leaving=True, reported=8) == 7


def test_no_common_round_is_an_error_naming_the_lost_device():
    inventories = {"a": inventory([7]), "c": inventory([7], {"b": [5]})}
    with pytest.raises(RuntimeFailure, match="after losing b"):
        resume_round(THREE, "b", inventories)
    with pytest.raises(RuntimeFailure, match="after losing b"):
        resume_round(THREE, "b", {"a": inventory([7]), "c": inventory([7], {"b": [7]})}, reported=6)


def test_heavy_uploads_one_sender_per_old_stage_and_the_lost_stage_from_its_backup():
    plan = make_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 4), ["b"], [4]), ((4, 5), ["c"], [4])],
                     global_batch=16, micro_batch=4)
    uploads = upload_plan(plan, "b")
    assert uploads["0"] == {"device": "a", "backup_of": None}
    assert uploads["1"] == {"device": "c", "backup_of": "b"}  # b backs up to the next stage's device
    assert upload_plan(plan, "b", leaving=True)["1"] == {"device": "b", "backup_of": None}
    assert transfer_plan(plan, [], "b") == []
