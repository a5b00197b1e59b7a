"""`hppctl psl plan|simulate` through the error boundary: outputs, files, exit codes 2 and 3."""

import json
import subprocess
import sys

import pytest

from hppctl.models.psl import PslPlan
from hppctl.store import load, save
from tests.conftest import make_profile

SPEC = """\
name: tiny
model: mobilenetv2
cut: [3, 15]
batch: 32
clients:
  - {name: pi, preset: rpi4, count: 3}
  - {name: nano0, preset: jetson-nano, bandwidth: 20mbit, cut: [2, 14]}
helpers:
  - {name: lap, preset: laptop-cpu}
  - {name: nx, preset: jetson-nx, memory: 2GB}
"""


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "psl.yaml"
    path.write_text(SPEC)
    return path


def test_plan_writes_a_plan_and_one_json_document(cli, spec, tmp_path):
    out = tmp_path / "plan.json"
    code, stdout, _ = cli("psl", "plan", "--spec", spec, "--out", out, "--json")
    assert code == 0
    doc = json.loads(stdout)
    plan = load(out, PslPlan)
    assert doc["plan"] == plan.model_dump(mode="json")
    assert plan.clients == ["pi0", "pi1", "pi2", "nano0"] and plan.cuts[3] == [2, 14]
    assert plan.requested_method == "auto" and plan.method in ("admm", "balanced-greedy", "search", "exact")
    assert doc["simulated_makespan_s"] == pytest.approx(plan.prediction.makespan_s)  # auto predicts what runs


def test_plan_table_for_people(cli, spec):
    code, stdout, _ = cli("psl", "plan", "--spec", spec, "--method", "balanced-greedy")
    assert code == 0
    assert "predicted batch makespan" in stdout and "F:pi0" in stdout


def test_compare_lists_every_method_against_random_fcfs(cli, spec):
    code, stdout, _ = cli("psl", "plan", "--spec", spec, "--compare", "--json", "--target-slots", "30")
    assert code == 0
    rows = {r["method"]: r for r in json.loads(stdout)}
    assert set(rows) == {"auto", "balanced-greedy", "admm", "exact", "random-fcfs"}
    assert rows["random-fcfs"]["vs_random_fcfs"] == 0
    assert rows["exact"]["makespan_slots"] <= rows["admm"]["makespan_slots"]


def test_plan_from_a_profile(cli, tmp_path):
    profile = tmp_path / "p.json"
    save(profile, make_profile(layers=6, speeds=(1, 1, 4)))
    code, stdout, _ = cli("psl", "plan", "--profile", profile, "--clients", "dev0,dev1", "--helpers", "dev2",
                          "--cut", "2,5", "--batch", "8", "--method", "exact", "--json")
    assert code == 0
    assert json.loads(stdout)["plan"]["assignment"] == ["dev2", "dev2"]


def test_simulate_json_and_trace(cli, spec, tmp_path):
    plan, trace = tmp_path / "plan.yaml", tmp_path / "trace.json"
    assert cli("psl", "plan", "--spec", spec, "--method", "admm", "--out", plan)[0] == 0
    code, stdout, _ = cli("psl", "simulate", "--plan", plan, "--policy", "ltf", "--slow", "lap=2", "--trace", trace,
                          "--json")
    assert code == 0
    doc = json.loads(stdout)
    assert doc["policy"] == "ltf" and len(doc["clients"]) == 4 and doc["makespan_s"] > 0
    assert json.loads(trace.read_text())["traceEvents"]


@pytest.mark.parametrize("edit,message", [
    (lambda s: s.replace("batch: 32", "batch: 32\nbogus: 1"), "psl.yaml: bogus: Extra inputs are not permitted"),
    (lambda s: s.replace("cut: [3, 15]", "cut: [15, 3]"), "psl.yaml: cut: σ1 must be below σ2"),
    (lambda s: s.replace("preset: rpi4", "preset: rpi9"), "psl.yaml: clients.0.preset: device 'pi': unknown preset 'rpi9'"),
    (lambda s: s.replace("mobilenetv2", "resnet9000"), "psl.yaml: model: unknown model 'resnet9000'"),
    (lambda s: s.replace("cut: [3, 15]", "cut: [3, 18]"), "cuts.0: client 'pi0': cut [3, 18] must satisfy 0 < σ1 < σ2 < 18"),
    (lambda s: s.replace("memory: 2GB", "memory: lots"), "psl.yaml: helpers.1.memory: expected a size"),
    (lambda s: s.replace("name: nano0", "name: pi0"), "duplicate device names: pi0"),
])
def test_bad_spec_is_exit_2_with_one_line(cli, spec, edit, message):
    spec.write_text(edit(SPEC))
    code, stdout, stderr = cli("psl", "plan", "--spec", spec)
    assert code == 2, stderr
    assert stdout == "" and stderr.count("\n") == 1 and stderr.startswith("error: ")
    assert message in stderr


def test_helpers_without_memory_for_a_client_is_exit_3(cli, spec):
    spec.write_text(SPEC.replace("{name: lap, preset: laptop-cpu}", "{name: lap, preset: laptop-cpu, memory: 10MB}")
                    .replace("memory: 2GB", "memory: 10MB"))
    code, _, stderr = cli("psl", "plan", "--spec", spec)
    assert code == 3 and "needs" in stderr and stderr.count("\n") == 1


@pytest.mark.parametrize("args,message", [
    (("--method", "magic"), "--method: unknown method 'magic'"),
    (("--slot", "-5ms"), "--slot"),
    (("--profile", "x.json"), "exactly one of --spec FILE or --profile FILE"),
    (("--cut", "1,2"), "--clients, --helpers and --cut go with --profile"),
    # non-finite: --slot 1e999 was a pydantic traceback, --rho nan/inf a ValueError from the LP solver
    (("--slot", "1e999"), "--slot: duration must be a finite number, got '1e999'"),
    (("--rho", "nan"), "--rho: must be a positive finite number (got nan)"),
    (("--rho", "inf"), "--rho: must be a positive finite number (got inf)"),
    (("--time-limit", "nan"), "--time-limit: must be a number of seconds from 0.01 to 2592000 (got nan)"),
    (("--seed", str(2**64)), "--seed: must be from 0 to 4294967295 (got 18446744073709551616)"),
])
def test_bad_flags_are_exit_2(cli, spec, args, message):
    code, _, stderr = cli("psl", "plan", "--spec", spec, *args)
    assert code == 2 and message in stderr and stderr.count("\n") == 1


def test_simulate_refuses_an_unknown_helper(cli, spec, tmp_path):
    plan = tmp_path / "plan.json"
    cli("psl", "plan", "--spec", spec, "--method", "balanced-greedy", "--out", plan)
    code, _, stderr = cli("psl", "simulate", "--plan", plan, "--slow", "nobody=2")
    assert code == 2 and "--slow: 'nobody' is not a helper" in stderr


def test_planner_and_simulator_import_no_torch_fabric_or_scipy():
    code = ("import sys, hppctl.planner.psl, hppctl.schedule.psl_sim, hppctl.models.psl; "
            "bad = [m for m in ('torch', 'fabric', 'scipy') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_help_has_examples(cli):
    code, stdout, _ = cli("psl", "plan", "--help")
    assert code == 0 and "hppctl psl plan --spec" in stdout
