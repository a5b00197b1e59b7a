"""Actions and schedule files: the text form round-trips, files round-trip, bad text is refused."""

import pytest
from pydantic import ValidationError

from hppctl.errors import BadInput
from hppctl.models.schedule import Action, Schedule
from hppctl.store import load, save
from tests.schedule.factories import make_schedule


@pytest.mark.parametrize("text, fields", [
    ("2F0[0:48]", dict(kind="F", stage=0, micro_batch=2, start=0, end=48)),
    ("13B4[16:64]", dict(kind="B", stage=4, micro_batch=13, start=16, end=64)),
    ("2SA0>tx1[0:16]", dict(kind="SA", stage=0, micro_batch=2, start=0, end=16, peer="tx1")),
    ("2RA1<nx0[0:16]", dict(kind="RA", stage=1, micro_batch=2, start=0, end=16, peer="nx0")),
    ("2SG1>nx0[0:16]", dict(kind="SG", stage=1, micro_batch=2, start=0, end=16, peer="nx0")),
    ("0RG0<jetson-nano.2_a[3:5]", dict(kind="RG", stage=0, micro_batch=0, start=3, end=5, peer="jetson-nano.2_a")),
    ("AR3", dict(kind="AR", stage=3)),
    ("STEP0", dict(kind="STEP", stage=0)),
])
def test_text_form_round_trips(text, fields):
    action = Action.from_str(text)
    assert action == Action(**fields)
    assert str(action) == text and Action.from_str(str(action)) == action


@pytest.mark.parametrize("text", [
    "F0[0:4]", "2F0[4:4]", "2F0[5:4]", "2X0[0:4]", "2SA0<tx1[0:4]", "2RA1>nx0[0:4]", "2SA0>[0:4]",
    "2SA0>tx1", "AR", "STEP", "AR0[0:4]", "2F0[0:4] extra", "", "2F-1[0:4]",
])
def test_malformed_text_is_refused(text):
    with pytest.raises(ValueError):
        Action.from_str(text)


@pytest.mark.parametrize("fields", [
    dict(kind="F", stage=0), dict(kind="F", stage=0, micro_batch=0, start=0, end=4, peer="x"),
    dict(kind="SA", stage=0, micro_batch=0, start=0, end=4), dict(kind="AR", stage=0, micro_batch=1),
])
def test_inconsistent_fields_are_refused(fields):
    with pytest.raises(ValidationError):
        Action(**fields)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_schedule_file_round_trips_as_text_actions(tmp_path, suffix):
    schedule = make_schedule([[3, 5], [8], [2, 2, 4]], M=5)
    path = tmp_path / f"s{suffix}"
    save(path, schedule)
    assert load(path, Schedule) == schedule
    assert "0SA0>d2[0:3]" in path.read_text()


def test_schedule_file_with_a_bad_action_names_the_device_and_position(tmp_path):
    path = tmp_path / "s.json"
    save(path, make_schedule([[4], [4]], M=2))
    path.write_text(path.read_text().replace('"0F0[0:4]"', '"0F0[0:4"', 1))
    with pytest.raises(BadInput, match=r"actions\.d0\.0: .*not an action: '0F0\[0:4'"):
        load(path, Schedule)


@pytest.mark.parametrize("change, needle", [
    (lambda d: d["stages"][0].update(samples=[1, 2]), "samples has 2 entries"),
    (lambda d: d["stages"][0].update(samples=[3]), "assigns 3 samples"),
    (lambda d: d["actions"].update(ghost=[]), "unknown ['ghost']"),
    (lambda d: d["stages"][1].update(devices=["d0"]), "more than one stage"),
])
def test_schedule_model_validation(change, needle):
    data = make_schedule([[4], [4]], M=2).model_dump(mode="json")
    change(data)
    with pytest.raises(ValidationError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        Schedule.model_validate(data)
