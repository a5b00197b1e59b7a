"""`hppctl simulate` through the error boundary: outputs, files, what-ifs and hostile inputs."""

import json
import subprocess
import sys

import pytest

from hppctl.models.schedule import Schedule
from hppctl.store import load, save
from tests.conftest import make_profile
from tests.schedule.test_trace import validate_trace_event_format


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from hppctl.models.plan import PlanRequest
    from hppctl.planner import make_plan
    tmp = tmp_path_factory.mktemp("sim")
    profile = make_profile(layers=12, speeds=(1, 2, 3), memory_gb=(4, 4, 8))
    save(tmp / "p.json", profile)
    save(tmp / "plan.yaml", make_plan(profile, PlanRequest(global_batch=256, micro_batch=32)))
    save(tmp / "other.json", make_profile(layers=12, speeds=(1, 2, 3), memory_gb=(4, 4, 8), seed=7))
    return tmp


def sim(cli, files, *extra):
    return cli("simulate", "--plan", files / "plan.yaml", *extra)


def test_json_report_with_profile(cli, files):
    code, out, err = sim(cli, files, "--profile", files / "p.json", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["timings"] == "profile" and doc["policy"] == "1f1b-asteroid"
    assert doc["throughput_samples_per_s"] == pytest.approx(256 / doc["round_latency_s"])
    assert {d["device"] for d in doc["devices"]} == {"dev0", "dev1", "dev2"}
    assert all(d["peak_memory_bytes"] > 0 and 0 <= d["bubble_fraction"] <= 1 for d in doc["devices"])
    assert doc["estimate"]["round_latency_s"] > 0


def test_plan_timings_without_profile_report_no_bytes(cli, files):
    code, out, _ = sim(cli, files, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["timings"] == "plan"
    assert all(d["peak_memory_bytes"] is None and d["peak_in_flight_micro_batches"] >= 1 for d in doc["devices"])


def test_table_output(cli, files):
    code, out, _ = sim(cli, files, "--profile", files / "p.json")
    assert code == 0 and "simulated round latency" in out and "planner's estimate" in out and "dev2" in out


def test_plan_for_another_profile_is_refused_in_one_line(cli, files):
    code, out, err = sim(cli, files, "--profile", files / "other.json")
    assert code == 2 and out == "" and "profile_digest" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name, content, needle", [
    ("bad.json", "{not json", "malformed JSON"),
    ("bad.yaml", "stages: [1, 2\n", "malformed YAML"),
    ("empty.json", "{}", "strategy: Field required"),
    ("plan.txt", "x", "unknown file extension"),
])
def test_malformed_plan_files_exit_2_in_one_line(cli, tmp_path, name, content, needle):
    path = tmp_path / name
    path.write_text(content)
    code, _, err = cli("simulate", "--plan", path)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_missing_plan_file(cli, tmp_path):
    code, _, err = cli("simulate", "--plan", tmp_path / "nope.yaml")
    assert code == 2 and "no such file" in err


def test_written_schedule_replays_to_the_same_figures(cli, files, tmp_path):
    path = tmp_path / "s.json"
    code, first, _ = sim(cli, files, "--profile", files / "p.json", "--write-schedule", path, "--json")
    assert code == 0 and load(path, Schedule).policy == "1f1b-asteroid"
    code, second, _ = sim(cli, files, "--profile", files / "p.json", "--schedule", path, "--json")
    assert code == 0 and json.loads(first)["round_latency_s"] == json.loads(second)["round_latency_s"]


def test_broken_schedule_file_names_the_rule(cli, files, tmp_path):
    path = tmp_path / "s.json"
    assert sim(cli, files, "--write-schedule", path, "--json")[0] == 0
    doc = json.loads(path.read_text())
    device = next(d for d, acts in doc["actions"].items() if "AR1" in acts)
    doc["actions"][device].remove("AR1")
    path.write_text(json.dumps(doc))
    code, _, err = sim(cli, files, "--schedule", path)
    assert code == 2 and "needs exactly one AR1" in err and len(err.strip().splitlines()) == 1


def test_schedule_for_another_plan_is_refused(cli, files, tmp_path):
    path = tmp_path / "s.json"
    assert sim(cli, files, "--write-schedule", path, "--json")[0] == 0
    doc = json.loads(path.read_text())
    doc["stages"][0]["layers"] = [0, doc["stages"][0]["layers"][1] - 1]
    path.write_text(json.dumps(doc))
    code, _, err = sim(cli, files, "--schedule", path)
    assert code == 2 and "stages.0" in err


@pytest.mark.parametrize("args, needle", [
    (("--fail", "dev0@3"), "needs --profile"),
    (("--warmup", "1,x"), "comma-separated positive integers"),
    (("--warmup", "0,1"), "at least 1"),
    (("--warmup", "1,2"), "must not increase"),
    (("--warmup", "1,1,1"), "one per stage: micro-batches in flight"),
    (("--policy", "zigzag"), "unknown schedule policy"),
    (("--policy", "gpipe", "--warmup", "2,1"), "alternatives"),
    (("--step-time", "-1"), "--step-time: must be a number of seconds from 0 to 86400 (got -1.0)"),
    (("--step-time", "nan"), "--step-time: must be a number of seconds from 0 to 86400 (got nan)"),  # was accepted
    (("--step-time", "1e300"), "--step-time: must be a number of seconds from 0 to 86400 (got 1e+300)"),
    # output paths that cannot be files: OSError tracebacks after the simulation, before
    (("--png", ""), "--png: . is a directory"),
    (("--png", "/"), "--png: / is a directory"),
    (("--trace", "/"), "--trace: / is a directory"),
])
def test_bad_flags_exit_2(cli, files, args, needle):
    code, out, err = sim(cli, files, *args)
    assert code == 2 and needle in err, err
    assert out == "" and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("policy, warmup", [("gpipe", [8, 8]), ("1f1b", [2, 1]), ("2(P-p)", [4, 2])])
def test_policy_what_if(cli, files, policy, warmup):
    code, out, _ = sim(cli, files, "--profile", files / "p.json", "--policy", policy, "--json")
    assert code == 0 and json.loads(out)["warmup"] == warmup


def test_blocking_mode_is_not_faster(cli, files):
    fast = json.loads(sim(cli, files, "--json")[1])["round_latency_s"]
    slow = json.loads(sim(cli, files, "--json", "--blocking")[1])["round_latency_s"]
    assert slow >= fast


def test_trace_file_is_valid(cli, files, tmp_path):
    path = tmp_path / "t.json"
    code, out, err = sim(cli, files, "--profile", files / "p.json", "--trace", path, "--json")
    assert code == 0 and json.loads(out) and "wrote" in err
    validate_trace_event_format(json.loads(path.read_text()))


def test_show_schedule_prints_text_actions(cli, files):
    code, out, _ = sim(cli, files, "--show-schedule")
    assert code == 0 and "STEP0" in out and "0F0[0:32]" in out


def test_help_explains_fail(cli):
    code, out, _ = cli("simulate", "--help")
    assert code == 0 and "--fail" in out and "recovery" in out


def test_schedule_and_simulate_modules_do_not_import_torch_or_fabric():
    code = ("import hppctl.schedule, hppctl.schedule.trace, hppctl.schedule.render, hppctl.cli.simulate, sys; "
            "bad = [m for m in ('torch', 'fabric', 'matplotlib') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_png_without_matplotlib_is_one_line_exit_2(cli, files, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    code, _, err = sim(cli, files, "--png", tmp_path / "t.png")
    # a missing optional dependency is the user's to install: bad input (issue 25, item 7)
    assert code == 2 and "pip install 'hppctl[plot]'" in err and not (tmp_path / "t.png").exists()


def test_png_is_written_when_matplotlib_is_installed(cli, files, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "t.png"
    code, _, _ = sim(cli, files, "--profile", files / "p.json", "--png", path)
    assert code == 0 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["t.png"]  # no temporary file left behind
