"""Pure: where a pipeline replay restarts (ft/replay.py)."""

import pytest

from hppctl.ft.replay import common_layout, migration_bytes, resume_round, transfer_plan, upload_plan
from hppctl.errors import RuntimeFailure
from hppctl.models.ft_documents import Transfer, Upload
from hppctl.models.reports import Inventory, StateSizes
from tests.runtime.factories import make_plan

THREE = [["a"], ["b"], ["c"]]


def inventory(snapshots, backups=None, layout=0, previous=None, own=None):
    return Inventory(snapshots=list(snapshots), backups=backups or {}, layout=layout, previous=previous,
                     state_bytes=StateSizes(own=own or {}, backups={}))


def test_resume_is_the_newest_round_every_stage_can_restore():
    inventories = {"a": inventory([5, 6, 7]), "c": inventory([4, 5, 6], {"b": [5, 6]})}
    assert resume_round(THREE, "b", inventories) == 6


def test_a_lost_single_device_stage_needs_its_backup():
    inventories = {"a": inventory([5, 6, 7]), "c": inventory([5, 6, 7], {"b": [4, 5]})}
    assert resume_round(THREE, "b", inventories) == 5


def test_a_leaver_reports_its_own_snapshots_and_needs_no_backup():
    inventories = {"a": inventory([5, 6, 7]), "b": inventory([5, 6, 7]), "c": inventory([5, 6, 7])}
    assert resume_round(THREE, "b", inventories, leavers={"b"}) == 7


def test_snapshots_of_rounds_not_yet_reported_are_not_candidates():
    # A worker snapshots round 7 before it reports round 6 (the backup exchange comes in between): a
    # re-plan that interrupts it there leaves round 6 unreported. Resuming at 7 skipped round 6's row
    # and the launcher waited for it forever (the intermittent hang of the SIGTERM replay test).
    inventories = {"a": inventory([5, 6, 7]), "b": inventory([5, 6, 7]), "c": inventory([5, 6, 7])}
    assert resume_round(THREE, "b", inventories, leavers={"b"}, reported=6) == 6
    assert resume_round(THREE, "b", inventories, leavers={"b"}, reported=8) == 7


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
    assert uploads["0"] == Upload(device="a")
    assert uploads["1"] == Upload(device="c", backup_of="b")  # b backs up to the next stage's device
    assert upload_plan(plan, "b", leavers={"b"})["1"] == Upload(device="b")
    assert transfer_plan(plan, [], "b") == []


FOUR = [["a"], ["b"], ["c"], ["d"]]


def test_two_devices_lost_together_each_restore_from_their_own_backup():
    # a|b|c|d back up along the ring a->b->c->d->a: losing b and d leaves their backups on c and a
    inventories = {"a": inventory([5, 6, 7], {"d": [5, 6]}), "c": inventory([5, 6, 7], {"b": [6, 7]})}
    assert resume_round(FOUR, ["b", "d"], inventories) == 6


def test_a_device_lost_with_its_backup_holder_is_an_error_naming_both():
    inventories = {"a": inventory([7], {"d": [7]}), "d": inventory([7], {"c": [7]})}
    with pytest.raises(RuntimeFailure, match="held only by b, whose backup holder c was lost too"):
        resume_round(FOUR, ["b", "c"], inventories)


def test_every_replica_of_a_stage_lost_is_an_error():
    with pytest.raises(RuntimeFailure, match=r"stage 0 lost every replica \(a, b\)"):
        resume_round([["a", "b"], ["c"]], ["a", "b"], {"c": inventory([7])})


def test_a_leaver_lost_with_a_crashed_device_sends_its_own_layers():
    plan = make_plan("tiny-mlp", [((0, 1), ["a"], [4]), ((1, 2), ["b"], [4]), ((2, 4), ["c"], [4]),
                                  ((4, 5), ["d"], [4])], global_batch=16, micro_batch=4)
    inventories = {"a": inventory([6, 7], {"d": [6, 7]}), "b": inventory([6, 7]), "c": inventory([6, 7])}
    assert resume_round([list(s.devices) for s in plan.stages], ["b", "d"], inventories, leavers={"b"}) == 7
    uploads = upload_plan(plan, ["b", "d"], leavers={"b"})
    assert uploads["1"] == Upload(device="b")  # the leaver still runs: its own state
    assert uploads["3"] == Upload(device="a", backup_of="d")  # the crashed tail: its backup on the head
    with pytest.raises(RuntimeFailure, match="stage 1's layers were held only by b, whose backup holder c"):
        upload_plan(plan, ["b", "c"])


def test_migrations_of_two_lost_stages_come_from_two_backups():
    from hppctl.planner.replan import migrations

    old = make_plan("tiny-mlp", [((0, 1), ["a"], [4]), ((1, 2), ["b"], [4]), ((2, 3), ["c"], [4]),
                                 ((3, 5), ["d"], [4])], global_batch=16, micro_batch=4)
    new = make_plan("tiny-mlp", [((0, 3), ["a"], [4]), ((3, 5), ["d"], [4])], global_batch=16, micro_batch=4)
    moves = migrations(old, new, ["b", "c"])
    # layers 1 and 2 are adjacent, and both go to a, but they were b's and c's: two runs, two origins
    assert [(m.device, m.start, m.end, m.source, m.backup_of) for m in moves] == [
        ("a", 1, 2, None, "b"), ("a", 2, 3, None, "c")]
    transfers = transfer_plan(old, moves, ["b", "c"], leavers={"c"})
    assert [(t.source, t.backup_of) for t in transfers] == [("c", "b"), ("c", None)]


def test_the_current_layout_is_replayed_when_every_survivor_is_on_it():
    on_new = inventory([4], layout=1, previous=inventory([3, 4]))
    assert common_layout({"a": on_new, "c": on_new}, current=1, previous=0) == (1, {"a": on_new, "c": on_new})


def test_the_previous_layout_is_replayed_when_a_survivor_never_reached_the_current_one():
    behind = inventory([3, 4], {"d": [4]})
    moved = inventory([4], layout=1, previous=inventory([3, 4]))
    layout, chosen = common_layout({"a": behind, "c": moved}, current=1, previous=0)
    assert layout == 0 and chosen == {"a": behind, "c": moved.previous}


def test_no_common_layout_when_a_survivor_has_already_dropped_the_previous_one():
    behind = inventory([3, 4])
    trained_on = inventory([4, 5], layout=1)
    assert common_layout({"a": behind, "c": trained_on}, current=1, previous=0) is None


def names_of(start, end):
    return [f"{layer}.weight" for layer in range(start, end)]


def test_migration_bytes_sizes_each_transfer_as_its_sender_holds_it_and_a_takeover_sends_nothing():
    """Issue 24 item 9: what a light re-plan moves, from the senders' reported sizes at the resume round."""
    sizes = {"a": StateSizes(own={"6": {"0.weight": 10, "1.weight": 20}}, backups={"c": {"6": {"4.weight": 7}}}),
             "b": StateSizes(own={"5": {"2.weight": 1}, "6": {"2.weight": 300, "3.weight": 400}}, backups={})}
    inventories = {d: Inventory(snapshots=[6], state_bytes=held) for d, held in sizes.items()}
    migrations = [Transfer(device="a", start=2, end=3, source="b"),                # 300
                  Transfer(device="b", start=4, end=5, source="a", backup_of="c"),  # 7, from the backup
                  Transfer(device="a", start=4, end=5, source="a", backup_of="c")]  # takeover: 0
    assert migration_bytes(migrations, inventories, 6, names_of) == 307
    assert migration_bytes([], inventories, 6, names_of) == 0


def test_migration_bytes_refuses_a_report_without_sizes():
    with pytest.raises(RuntimeFailure, match="b's stall report gives no sizes of its own state at round 6"):
        migration_bytes([Transfer(device="a", start=2, end=3, source="b")], {"b": inventory([6])}, 6, names_of)
    with pytest.raises(RuntimeFailure, match="b's stall report gives no sizes of its backup of c at round 6"):
        migration_bytes([Transfer(device="a", start=2, end=3, source="b", backup_of="c")],
                        {"b": inventory([6], own={"6": {}})}, 6, names_of)
