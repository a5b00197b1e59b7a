"""Values in files (issue 23, item 7): sizes, rates, durations and times are finite and bounded, and a
bad one is one line naming the file and field, exit 2, nothing written (no OverflowError, no `null`)."""

from __future__ import annotations

import json

import pytest

from hppctl.errors import BadInput
from hppctl.models.lab import LabSpec
from hppctl.models.units import parse_bytes, parse_duration, parse_rate
from hppctl.store import load, save
from tests.conftest import make_profile

HUGE = [1e400, "1e400", "1.0e400", float("nan"), pytest.param(10**400, id="10**400"), "1e400GB"]


@pytest.mark.parametrize("parse", [parse_bytes, parse_rate, parse_duration])
@pytest.mark.parametrize("value", HUGE)
def test_non_finite_values_are_a_value_error_not_an_overflow(parse, value):
    with pytest.raises(ValueError) as err:
        parse(value)
    assert len(str(err.value)) < 200  # a 401-digit value is not repeated whole


@pytest.mark.parametrize("parse, value", [(parse_bytes, 2**51), (parse_rate, "1e-300bit"), (parse_rate, 1e20),
                                          (parse_duration, "2e5")])
def test_values_beyond_the_bounds_are_refused(parse, value):
    with pytest.raises(ValueError, match="at most|between"):
        parse(value)


def test_a_bare_number_string_is_bytes_per_second():
    assert parse_rate("1e6") == 1e6  # YAML reads `bandwidth: 1e6` as a string; it was "unknown unit ''"


CLUSTER = "name: c\nbandwidth: {bw}\ndevices:\n- {{name: a, preset: jetson-nano, memory: {mem}}}\n" \
          "- {{name: b, preset: jetson-nano}}\nssh: {{connect_timeout_s: {timeout}}}\n"


@pytest.mark.parametrize("field, bw, mem, timeout", [
    ("devices.0.memory", "100mbit", "1e400", 10), ("devices.0.memory", "100mbit", ".inf", 10),
    ("devices.0.memory", "100mbit", "1e30", 10),
    ("bandwidth", ".inf", "1GB", 10), ("bandwidth", "'1e400mbit'", "1GB", 10), ("bandwidth", "'1e-300bit'", "1GB", 10),
    ("ssh.connect_timeout_s", "100mbit", "1GB", ".inf"), ("ssh.connect_timeout_s", "100mbit", "1GB", "1e9"),
])
def test_cluster_values_exit_2_naming_the_field_and_write_nothing(cli, tmp_path, field, bw, mem, timeout):
    cluster, out = tmp_path / "c.yaml", tmp_path / "p.json"
    cluster.write_text(CLUSTER.format(bw=bw, mem=mem, timeout=timeout))
    code, stdout, err = cli("profile", "--cluster", cluster, "--model", "tiny-cnn", "--out", out)
    assert code == 2 and stdout == "" and not out.exists()
    assert err.startswith(f"error: {cluster}: {field}: ") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("host", ["{name: h, cpu: 1, memory: 1e400}", "{name: h, cpu: 1, memory: 1GB, bandwidth: .inf}",
                                  "{name: h, cpu: 1, memory: 1GB, delay: .inf}", "{name: h, cpu: .inf, memory: 1GB}"])
def test_lab_spec_values(tmp_path, host):
    spec = tmp_path / "lab.yaml"
    spec.write_text(f"name: l\nhosts:\n- {host}\n")
    with pytest.raises(BadInput, match=rf"^{spec}: hosts\.0\.(memory|bandwidth|delay|cpu): .*finite"):
        load(spec, LabSpec)


@pytest.mark.parametrize("path, value", [
    (("devices", 0, "forward_s", 0, 0), float("inf")), (("devices", 0, "backward_s", 1, 0), 1e308),
    (("devices", 0, "memory_bytes"), 10**30), (("default_bytes_per_s",), float("inf")),
    (("layers", 0, "param_bytes"), 10**30),
])
def test_profile_times_rates_and_bytes_are_finite_and_bounded(cli, tmp_path, path, value):
    doc = make_profile(layers=4, speeds=(1, 2)).model_dump(mode="json")
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps(doc))  # writes Infinity, which Python's json reads back as inf
    code, _, err = cli("plan", "--profile", bad, "--global-batch", 8, "--micro-batch", 4)
    field = ".".join(str(k) for k in path)
    assert code == 2 and err.startswith(f"error: {bad}: {field}: ") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("field", ["forward_s", "backward_s", "allreduce_s"])
def test_a_plan_stage_time_of_inf_names_the_plan_not_the_policy(cli, tmp_path, field):
    from hppctl.models.plan import PlanRequest
    from hppctl.planner import make_plan

    doc = make_plan(make_profile(layers=4, speeds=(1, 2)), PlanRequest(global_batch=8, micro_batch=4)).model_dump(mode="json")
    doc["stages"][0][field] = float("inf")
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps(doc))
    code, _, err = cli("simulate", "--plan", bad)
    assert code == 2 and err.startswith(f"error: {bad}: stages.0.{field}: ") and "--policy" not in err
