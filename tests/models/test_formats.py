"""The data model: strict validation, units, JSON/YAML round trips, atomic writes."""

import os

import pytest

from hppctl.errors import BadInput, RuntimeFailure
from hppctl.models import ClusterSpec, HppPlan, Profile
from hppctl.models.plan import PlanRequest
from hppctl.models.units import parse_bytes, parse_duration, parse_rate
from hppctl.planner import make_plan
from hppctl.store import load, save, validate
from tests.conftest import make_profile


@pytest.mark.parametrize("text, expected", [("4GB", 4 * 10**9), ("512MiB", 512 * 2**20), (1024, 1024), ("1.5 GiB", int(1.5 * 2**30))])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text, expected", [("100mbit", 12.5e6), ("1gbit", 125e6), ("50mbit", 6.25e6), (1e6, 1e6), ("1mbps", 1e6)])
def test_parse_rate(text, expected):
    assert parse_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["-3GB", "0", "lots", "3XB", True, None, "100 furlongs"])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(ValueError):
        parse_bytes(bad)


def test_parse_duration():
    assert parse_duration("2ms") == pytest.approx(0.002) and parse_duration(1) == 1.0


def cluster_doc(**over):
    doc = {"name": "c", "bandwidth": "100mbit",
           "devices": [{"name": "a", "preset": "jetson-nano"}, {"name": "b", "preset": "jetson-tx2", "memory": "6GB"}],
           "links": [{"between": ["a", "b"], "bandwidth": "50mbit"}]}
    doc.update(over)
    return doc


def test_cluster_defaults_and_overrides():
    c = validate(ClusterSpec, cluster_doc(), "c.yaml")
    assert c.bandwidth_between("a", "b") == pytest.approx(6.25e6)
    assert c.device("b").memory == 6 * 10**9 and c.format_version == 1


@pytest.mark.parametrize("over, needle", [
    ({"devices": [{"name": "a", "preset": "x", "colour": "red"}]}, "devices.0.colour"),
    ({"devices": [{"name": "a", "preset": "x"}, {"name": "a", "preset": "y"}]}, "duplicate device names"),
    ({"devices": [{"name": "a", "preset": "x", "host": "10.0.0.1"}]}, "exactly one of"),
    ({"devices": [{"name": "a"}]}, "exactly one of"),
    ({"links": [{"between": ["a", "zz"], "bandwidth": "1mbit"}]}, "unknown device 'zz'"),
    ({"bandwidth": "-5mbit"}, "bandwidth"),
    ({"devices": [{"name": "a", "preset": "x", "memory": -1}]}, "devices.0.memory"),
    ({"devices": []}, "devices"),
    ({"devices": [{"name": "a b", "preset": "x"}]}, "devices.0.name"),
])
def test_cluster_errors_name_the_field(over, needle):
    with pytest.raises(BadInput) as e:
        validate(ClusterSpec, cluster_doc(**over), "c.yaml")
    assert needle in str(e.value) and str(e.value).startswith("c.yaml: ")


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
def test_round_trip_every_format(tmp_path, suffix):
    profile = make_profile(layers=5, speeds=(1, 2))
    plan = make_plan(profile, PlanRequest(global_batch=64, micro_batch=16))
    cluster = validate(ClusterSpec, cluster_doc(), "c.yaml")
    for obj, model in ((profile, Profile), (plan, HppPlan), (cluster, ClusterSpec)):
        path = tmp_path / f"{model.__name__}{suffix}"
        save(path, obj)
        assert load(path, model) == obj
    assert load(tmp_path / f"Profile{suffix}", Profile).digest() == profile.digest()


def test_unknown_extension_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="unknown file extension"):
        save(tmp_path / "p.txt", make_profile(layers=2, speeds=(1,)))


def test_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    target = tmp_path / "p.json"

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(RuntimeFailure, match="p.json: writing failed \\(disk full\\)"):  # one line at the CLI, exit 1
        save(target, make_profile(layers=2, speeds=(1,)))
    assert list(tmp_path.iterdir()) == []


def test_plan_validation_catches_inconsistent_plans():
    plan = make_plan(make_profile(layers=6, speeds=(1, 2, 3)), PlanRequest(global_batch=64, micro_batch=16))
    doc = plan.model_dump(mode="json")
    doc["stages"][0]["samples"] = [s + 1 for s in doc["stages"][0]["samples"]]
    with pytest.raises(BadInput, match="samples per micro-batch"):
        validate(HppPlan, doc, "plan.json")
    doc = plan.model_dump(mode="json")
    doc["num_micro_batches"] = 3
    with pytest.raises(BadInput, match="global_batch"):
        validate(HppPlan, doc, "plan.json")


def test_profile_shape_errors():
    doc = make_profile(layers=3, speeds=(1,)).model_dump(mode="json")
    doc["devices"][0]["forward_s"][1] = [0.1]
    with pytest.raises(BadInput, match=r"forward_s\[1\]"):
        validate(Profile, doc, "p.json")
    doc = make_profile(layers=3, speeds=(1,)).model_dump(mode="json")
    doc["devices"][0]["batch_sizes"] = list(reversed(doc["devices"][0]["batch_sizes"]))
    with pytest.raises(BadInput, match="strictly increasing"):
        validate(Profile, doc, "p.json")


def test_a_document_of_another_kind_is_named_in_one_line(tmp_path):
    """Regression: an HPP plan given where a PSL plan is needed reported `kind` plus '27 more errors'."""
    from hppctl.errors import BadInput
    from hppctl.models.plan import HppPlan
    from hppctl.models.psl import PslPlan
    from hppctl.store import load

    hpp = tmp_path / "plan.yaml"
    hpp.write_text("kind: hpp\nformat_version: 1\n")
    with pytest.raises(BadInput) as err:
        load(hpp, PslPlan)
    assert str(err.value) == f"{hpp}: kind: this is a 'hpp' document; this command needs a 'psl' one"
    psl = tmp_path / "psl.json"
    psl.write_text('{"kind": "psl"}')
    with pytest.raises(BadInput, match="this is a 'psl' document; this command needs a 'hpp' one"):
        load(psl, HppPlan)
