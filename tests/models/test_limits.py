"""Issue 23 item 8: size limits of the typed files (hppctl/limits.py, docs/formats.md Limits), and
duplicate-name checks that stay linear (20,000 devices took 10 s to validate)."""

from __future__ import annotations

import pytest

from hppctl.errors import BadInput
from hppctl.limits import MAX_DEVICES, MAX_LAYERS, MAX_MICRO_BATCHES, MAX_PSL_CLIENTS
from hppctl.models import ClusterSpec, HppPlan, Profile
from hppctl.models.base import duplicates
from hppctl.models.lab import LabSpec
from hppctl.models.plan import PlanRequest
from hppctl.models.psl import PslSpec
from hppctl.planner import make_plan
from hppctl.store import describe_validation_error, validate
from tests.conftest import make_profile


class CountingName(str):
    """A name that counts how often it is compared for equality."""

    comparisons = 0

    def __eq__(self, other):
        CountingName.comparisons += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_duplicates_compares_each_name_a_bounded_number_of_times():
    names = [CountingName(f"d{k}") for k in range(5000)] + [CountingName("d7")]
    CountingName.comparisons = 0
    assert duplicates(names) == ["d7"]
    assert CountingName.comparisons <= 2 * len(names)  # `names.count(n)` per name made 25 million


def _devices(n: int) -> list[dict]:
    return [{"name": f"d{k}", "preset": "jetson-nano"} for k in range(n)]


def test_a_cluster_at_the_device_limit_validates_and_one_more_is_refused():
    assert len(validate(ClusterSpec, {"name": "c", "devices": _devices(MAX_DEVICES)}, "c.yaml").devices) == MAX_DEVICES
    with pytest.raises(BadInput) as e:
        validate(ClusterSpec, {"name": "c", "devices": _devices(MAX_DEVICES + 1)}, "c.yaml")
    assert str(e.value).startswith("c.yaml: devices: ") and str(MAX_DEVICES) in str(e.value)


def test_many_duplicates_make_one_short_line():
    with pytest.raises(BadInput) as e:
        validate(ClusterSpec, {"name": "c", "devices": _devices(MAX_DEVICES // 2) * 2}, "c.yaml")
    assert "duplicate device names: d0, d1, d10, d100, d1000 and 9995 more" in str(e.value)


def test_lab_hosts_are_limited_and_checked_linearly():
    hosts = [{"name": f"h{k}", "preset": "jetson-nano"} for k in range(MAX_DEVICES + 1)]
    with pytest.raises(BadInput, match=r"^l.yaml: hosts: .*20000"):
        validate(LabSpec, {"name": "l", "subnet": "10.0.0.0/8", "hosts": hosts}, "l.yaml")
    with pytest.raises(BadInput, match="duplicate host names: h0"):
        validate(LabSpec, {"name": "l", "subnet": "10.0.0.0/8", "hosts": hosts[:MAX_DEVICES - 1] + hosts[:1]}, "l.yaml")


def _psl(**over) -> dict:
    doc = {"name": "s", "model": "mobilenetv2", "cut": [3, 15], "clients": [{"name": "pi", "preset": "rpi4"}],
           "helpers": [{"name": "lap", "preset": "laptop-cpu"}]}
    doc.update(over)
    return doc


@pytest.mark.parametrize("over, needle", [
    ({"clients": [{"name": "pi", "preset": "rpi4", "count": 1_000_000}]}, "clients.0.count: Input should be less than or equal to 5000"),
    ({"clients": [{"name": "pi", "preset": "rpi4", "count": 4000}, {"name": "nano", "preset": "rpi4", "count": 4000}]},
     "8000 clients, more than the limit of 5000"),
    ({"helpers": [{"name": "lap", "preset": "laptop-cpu", "count": 101}]}, "101 helpers, more than the limit of 100"),
    ({"clients": [{"name": "pi", "preset": "rpi4", "count": 5000}], "helpers": [{"name": "h", "preset": "rpi4", "count": 20}]},
     "100000 helpers x clients, more than the limit of 50000"),
    ({"slot": 1e-12}, "slot: Value error, slot must be at least 1e-06 s"),
])
def test_psl_spec_limits(over, needle):
    with pytest.raises(BadInput) as e:
        validate(PslSpec, _psl(**over), "psl.yaml")
    assert str(e.value).startswith("psl.yaml: ") and needle.replace("Value error, ", "") in str(e.value)


def test_psl_spec_at_the_client_limit_validates():
    spec = validate(PslSpec, _psl(clients=[{"name": "pi", "preset": "rpi4", "count": MAX_PSL_CLIENTS}]), "psl.yaml")
    assert len(spec.client_names()) == MAX_PSL_CLIENTS


def test_plan_request_micro_batches():
    assert PlanRequest(global_batch=10_000, micro_batch=1).num_micro_batches == 10_000  # `plan --global-batch 10000`
    with pytest.raises(ValueError, match=f"1000000 micro-batches per round, more than the limit of {MAX_MICRO_BATCHES}"):
        PlanRequest(global_batch=10**6, micro_batch=1)


def test_a_plan_with_a_million_micro_batches_is_refused():
    doc = make_plan(make_profile(layers=4, speeds=(1, 2)), PlanRequest(global_batch=64, micro_batch=1)).model_dump(mode="json")
    doc.update(global_batch=10**6, num_micro_batches=10**6)
    with pytest.raises(BadInput, match=r"^plan.json: num_micro_batches: Input should be less than or equal to 16384 \(got 1000000\)"):
        validate(HppPlan, doc, "plan.json")


def test_a_plan_layer_range_beyond_the_limit_is_refused():
    doc = make_plan(make_profile(layers=4, speeds=(1,)), PlanRequest(global_batch=8, micro_batch=4)).model_dump(mode="json")
    doc["stages"][0]["layers"] = [0, 10**12]
    with pytest.raises(BadInput, match=r"stages.0.layers.1: Input should be less than or equal to 4096"):
        validate(HppPlan, doc, "plan.json")


def test_profile_layers_and_duplicate_devices():
    doc = make_profile(layers=2, speeds=(1, 1)).model_dump(mode="json")
    too_many = dict(doc, layers=doc["layers"] * (MAX_LAYERS // 2 + 1))
    with pytest.raises(BadInput, match=r"^p.json: layers: List should have at most 4096 items"):
        validate(Profile, too_many, "p.json")
    doc["devices"][1]["name"] = doc["devices"][0]["name"]
    with pytest.raises(BadInput, match="duplicate device names in profile: dev0"):
        validate(Profile, doc, "p.json")


def test_describe_validation_error_caps_the_echoed_value():
    from pydantic import ValidationError

    try:
        ClusterSpec.model_validate({"name": "n" * 10**6, "devices": _devices(1)})
    except ValidationError as e:
        line = describe_validation_error("c.yaml", e)
    assert line.startswith("c.yaml: name: ") and len(line) < 300 and "…" in line
