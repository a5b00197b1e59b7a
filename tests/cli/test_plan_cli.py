"""`hppctl plan` end to end through the error boundary: outputs, files, and hostile inputs."""

import json

import pytest

from hppctl.models.plan import HppPlan
from hppctl.store import load, save
from tests.conftest import make_profile


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "p.json"
    save(path, make_profile(layers=12, speeds=(1, 2, 3), memory_gb=(4, 4, 8)))
    return path


def test_plan_writes_a_valid_plan_and_json(cli, profile_file, tmp_path):
    out = tmp_path / "plan.yaml"
    code, stdout, _ = cli("plan", "--profile", profile_file, "--global-batch", 256, "--micro-batch", 32,
                          "--out", out, "--json")
    assert code == 0
    plan = load(out, HppPlan)
    assert json.loads(stdout)["prediction"] == plan.model_dump(mode="json")["prediction"]
    assert plan.num_micro_batches == 8


def test_a_profile_with_missing_devices_plans_on_the_rest_and_says_so(cli, tmp_path):
    from hppctl.models.profile import MissingDevice

    profile = make_profile(layers=12, speeds=(1, 2), memory_gb=(4, 4))
    profile = profile.model_copy(update={"missing_devices": [MissingDevice(name="pi9", reason="unreachable: refused")]})
    save(tmp_path / "partial.json", profile)
    code, stdout, stderr = cli("plan", "--profile", tmp_path / "partial.json", "--global-batch", 64,
                               "--micro-batch", 16, "--json")
    assert code == 0 and json.loads(stdout)["strategy"]
    assert "has no measurement of pi9 (unreachable: refused); planning on the 2 devices it has" in stderr


def test_compare_json_lists_every_strategy(cli, profile_file):
    code, stdout, _ = cli("plan", "--profile", profile_file, "--global-batch", 256, "--micro-batch", 32,
                          "--compare", "--json")
    assert code == 0
    rows = json.loads(stdout)
    assert {r["strategy"] for r in rows} == {"asteroid", "asteroid-paper", "dp", "pp", "pipedream", "dapple",
                                             "bipartition", "bipartition-bsa", "bipartition-paper", "layerwise"}
    assert set(rows[0]) >= {"strategy", "feasible", "throughput", "round_latency_s", "peak_memory_ratio"}


def test_explain_marks_the_dominant_step(cli, profile_file):
    code, stdout, _ = cli("plan", "--profile", profile_file, "--global-batch", 256, "--micro-batch", 32,
                          "--explain", "--json")
    steps = json.loads(stdout)["steps"]
    assert code == 0 and sum(s["dominant"] for s in steps) == 1
    assert max(s["end_s"] for s in steps) == pytest.approx(json.loads(stdout)["plan"]["prediction"]["round_latency_s"])


def test_existing_plan_against_another_profile_is_refused(cli, profile_file, tmp_path):
    plan_file = tmp_path / "plan.json"
    assert cli("plan", "--profile", profile_file, "--global-batch", 64, "--micro-batch", 8, "--out", plan_file)[0] == 0
    other = tmp_path / "other.json"
    save(other, make_profile(layers=12, speeds=(1, 2, 3), memory_gb=(4, 4, 8), seed=7))
    code, _, err = cli("plan", "--profile", other, "--plan", plan_file, "--explain")
    assert code == 2 and "profile_digest" in err and str(plan_file) in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("content, suffix, needle", [
    ("{not json", ".json", "malformed JSON"),
    ("a: [1, 2\n", ".yaml", "malformed YAML"),
    ('{"format_version": 1, "source": "preset"}', ".json", "field required"),
    ("- 1\n- 2\n", ".yaml", "expected a mapping"),
])
def test_malformed_profile_gets_one_line_and_exit_2(cli, tmp_path, content, suffix, needle):
    bad = tmp_path / f"bad{suffix}"
    bad.write_text(content)
    code, stdout, err = cli("plan", "--profile", bad, "--global-batch", 64, "--micro-batch", 8)
    assert code == 2 and stdout == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and str(bad) in err
    assert needle.lower() in err.lower()


def test_wrong_type_names_the_field(cli, tmp_path, profile_file):
    data = json.loads(profile_file.read_text())
    data["devices"][1]["memory_bytes"] = "lots"
    bad = tmp_path / "typed.json"
    bad.write_text(json.dumps(data))
    code, _, err = cli("plan", "--profile", bad, "--global-batch", 64, "--micro-batch", 8)
    assert code == 2 and "devices.1.memory_bytes" in err


@pytest.mark.parametrize("g, b, needle", [(0, 8, "--global-batch"), (-64, 8, "--global-batch"),
                                          (64, 0, "--micro-batch"), (64, 7, "does not divide")])
def test_bad_batches(cli, profile_file, g, b, needle):
    code, _, err = cli("plan", "--profile", profile_file, "--global-batch", g, "--micro-batch", b)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_unknown_strategy(cli, profile_file):
    code, _, err = cli("plan", "--profile", profile_file, "--global-batch", 64, "--micro-batch", 8, "--strategy", "x")
    assert code == 2 and "unknown strategy 'x'" in err


def test_missing_file(cli, tmp_path):
    code, _, err = cli("plan", "--profile", tmp_path / "nope.json", "--global-batch", 64, "--micro-batch", 8)
    assert code == 2 and "no such file" in err


def test_infeasible_request_exits_3_naming_device_and_bytes(cli, tmp_path):
    path = tmp_path / "tight.json"
    save(path, make_profile(layers=6, speeds=(1, 1), memory_gb=(0.01, 0.01), activation_scale=200))
    out = tmp_path / "never.json"
    code, _, err = cli("plan", "--profile", path, "--global-batch", 512, "--micro-batch", 256, "--out", out)
    assert code == 3 and "dev" in err and "missing" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("argv", [("plan", "--profile"), ("plan", "--profile", "x.json", "--global-batch", "abc"),
                                  ("no-such-command",), ("plan", "--bogus")])
def test_usage_errors_are_one_line_exit_2(cli, argv):
    # regression: typer vendors its own click, so usage errors used to escape as tracebacks (exit 1)
    code, _, err = cli(*argv)
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_saved_files_get_normal_permissions(cli, profile_file, tmp_path):
    out = tmp_path / "plan.json"
    assert cli("plan", "--profile", profile_file, "--global-batch", 64, "--micro-batch", 8, "--out", out)[0] == 0
    assert out.stat().st_mode & 0o044  # regression: mkstemp's 0600 used to survive the rename


def test_an_output_path_that_cannot_be_written_is_one_line_and_exit_2(cli, profile_file, tmp_path):
    # it was a FileNotFoundError traceback (and exit 1) from the store's mkdir
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for out, needle in ((blocker / "plan.json", "cannot create the folder"), (tmp_path / "dir.json", "is a directory")):
        if needle == "is a directory":
            out.mkdir()
        code, stdout, stderr = cli("plan", "--profile", profile_file, "--global-batch", 64, "--micro-batch", 8,
                                   "--out", out)
        assert code == 2 and stderr.startswith(f"error: --out: {out}") and needle in stderr
        assert len(stderr.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "dir.json", "p.json"]  # nothing half-written


def test_the_profile_is_read_and_parsed_once(cli, profile_file, monkeypatch):
    """It was read twice, once to ask whether it is an inference profile: 0.4 of the 1000 x 16 plan's ~9 s."""
    import hppctl.store as store

    reads, original = [], store.read_document
    monkeypatch.setattr(store, "read_document", lambda path: reads.append(path) or original(path))
    monkeypatch.setattr("hppctl.cli.plan.read_document", store.read_document, raising=False)
    code, _, _ = cli("plan", "--profile", profile_file, "--global-batch", 64, "--micro-batch", 16)
    assert code == 0 and reads == [profile_file]
