"""A round's COMPLETE.json as `--resume` reads it (checkpoint.read_meta), fuzzed: whatever the file
holds, reading it returns the record or raises `BadInput` with one line naming the file, never
another exception (each used to be a traceback: JSONDecodeError, TypeError, KeyError, pydantic's).
Pure: no worker, no torch file is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hppctl.errors import BadInput
from hppctl.runtime.checkpoint import COMPLETE, CheckpointDir, read_meta
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.session import Lineage, plan_digest, run_fingerprint
from tests.runtime.factories import make_plan

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

PLAN = make_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])], global_batch=16, micro_batch=4)
FIELDS = ["plan", "dataset", "seed", "round", "stages", "origin_plan", "lost", "sha256"]
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=12)


@pytest.fixture(scope="module")
def record(tmp_path_factory) -> tuple[Path, str]:
    """A round written by `write_round` (stage files of placeholder bytes): its COMPLETE.json and text."""
    ck = CheckpointDir(tmp_path_factory.mktemp("ck"))
    meta = {**run_fingerprint(PLAN, TrainOptions()), **Lineage(origin=plan_digest(PLAN)).as_meta()}
    where = ck.write_round(2, {0: b"stage 0", 1: b"stage 1"}, meta)
    return where / COMPLETE, (where / COMPLETE).read_text()


def read_or_refuse(path: Path) -> None:
    try:
        read_meta(path, 2)
    except BadInput as e:
        message = str(e)
        assert str(path) in message and "\n" not in message and len(message) < 1000, message


def test_the_written_record_reads_back(record):
    path, text = record
    assert read_meta(path, 2) == json.loads(text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=JSON_VALUES)
def test_any_value_in_any_field(record, tmp_path_factory, field, value):
    path, text = record
    meta = json.loads(text)
    meta[field] = value
    copy = tmp_path_factory.mktemp("r") / COMPLETE
    copy.write_text(json.dumps(meta))
    read_or_refuse(copy)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_truncation_or_byte_change(record, tmp_path_factory, data):
    path, text = record
    raw = bytearray(text.encode())
    cut = data.draw(st.integers(0, len(raw)))
    raw = raw[:cut]
    if raw and data.draw(st.booleans()):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    copy = tmp_path_factory.mktemp("r") / COMPLETE
    copy.write_bytes(bytes(raw))
    read_or_refuse(copy)


@pytest.mark.parametrize("field", ["plan", "round", "stages"])
def test_a_missing_field(record, tmp_path, field):
    path, text = record
    meta = json.loads(text)
    del meta[field]
    (tmp_path / COMPLETE).write_text(json.dumps(meta))
    if field == "plan":  # old records without a plan read; the resume refuses them naming the plan
        read_meta(tmp_path / COMPLETE, 2)
    else:
        with pytest.raises(BadInput, match=f"{field}: must"):
            read_meta(tmp_path / COMPLETE, 2)
