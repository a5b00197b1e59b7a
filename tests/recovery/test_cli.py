"""The fault-tolerance flags of `hppctl run` / `hppctl coordinator` (no processes)."""

from __future__ import annotations

import json
from typing import get_args

import pytest

from hppctl.cli.coordinator import DESCRIBE, check_recovery_flags, describe
from hppctl.driver import recovery_options
from hppctl.errors import BadInput
from hppctl.models.events import Armed, DeviceLost, DeviceSuspected, RunEvent, RunReplanned, RunResumed
from tests.recovery.factories import preset_profile


@pytest.fixture(scope="module")
def profile():
    return preset_profile("tiny-mlp", {"a": "jetson-nano", "b": "jetson-tx2"})


def test_recovery_is_on_with_a_profile_and_off_without(profile):
    options = recovery_options(profile, heartbeat=0.5, timeout=2.0, probe_timeout=1.0, replan="heavy", replicate_every=2)
    assert (options.heartbeat_s, options.timeout_s, options.probe_s, options.replan, options.replicate_every) == \
        (0.5, 2.0, 1.0, "heavy", 2)
    assert recovery_options(None, heartbeat=1, timeout=3, probe_timeout=2, replan="light", replicate_every=1) is None
    assert recovery_options(profile, heartbeat=1, timeout=3, probe_timeout=2, replan="off", replicate_every=1) is None


@pytest.mark.parametrize("kw,message", [
    ({"replan": "medium"}, "--replan: unknown value 'medium'"),
    ({"heartbeat": 0}, "--heartbeat: must be a number of seconds from 0.01 to 2592000"),
    ({"heartbeat": 1e-300, "timeout": 3.0}, "--heartbeat: must be a number of seconds from 0.01"),
    ({"probe_timeout": 1e300}, "--probe-timeout: must be a number of seconds from 0.01 to 2592000"),
    ({"timeout": 1.0}, "--failure-timeout: 1.0 s must exceed --heartbeat 1.0 s"),
    ({"replicate_every": 0}, "--replicate-every: must be a positive finite number"),
])
def test_bad_values_name_the_flag(profile, kw, message):
    args = {"heartbeat": 1.0, "timeout": 3.0, "probe_timeout": 2.0, "replan": "light", "replicate_every": 1, **kw}
    with pytest.raises(BadInput, match=message):
        check_recovery_flags(**args)


def test_coordinator_needs_plan_cluster_and_profile(cli):
    code, _, err = cli("coordinator", "--plan", "p.yaml")
    assert code == 2 and "--cluster: required" in err


@pytest.mark.parametrize("args, message", [
    (["--rounds", "0"], "--rounds: must be a positive finite number (got 0)"),
    (["--failure-timeout", "0.5"], "--failure-timeout: 0.5 s must exceed --heartbeat 1.0 s"),
    (["--listen", "127.0.0.1:70000"], "--listen: '127.0.0.1:70000': port 70000 is out of range"),
    (["--listen", "192.0.2.1:29500"], "--listen: '192.0.2.1:29500': this machine cannot listen on 192.0.2.1"),
    (["--events", "{blocker}/ev.jsonl"], "--events: {blocker}/ev.jsonl: cannot create the folder"),
    (["--momentum", "-1"], "--momentum: must be a non-negative finite number (got -1.0)"),
    (["--optimizer", "rmsprop"], "--optimizer: unknown value 'rmsprop' (sgd or adam)"),
])
def test_coordinator_bad_values_exit_2_naming_the_flag(cli, tmp_path, profile, args, message):
    # each used to end in a traceback (exit 1), --events only after the workers had started
    from hppctl.store import save
    from tests.runtime.factories import make_plan

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    save(tmp_path / "profile.json", profile)
    save(tmp_path / "plan.yaml", make_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])],
                                           global_batch=8, micro_batch=4))
    (tmp_path / "cluster.yaml").write_text("name: local\ndevices:\n  - {name: a, local: true}\n  - {name: b, local: true}\n")
    args = [a.format(blocker=blocker) for a in args]
    code, out, err = cli("coordinator", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "cluster.yaml",
                         "--profile", tmp_path / "profile.json", *args)
    assert code == 2, err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert message.format(blocker=blocker) in err and out == ""


def test_coordinator_calls_the_silence_timeout_failure_timeout_as_run_does(cli):
    # `--timeout` was 3 s of silence here and the 300 s join wait in `hppctl run` (issue 25 item 7)
    code, out, _ = cli("coordinator", "--help")
    assert code == 0 and "--failure-timeout" in out and "--timeout" not in out.replace("--failure-timeout", "")


def test_coordinator_timeout_still_works_as_a_deprecated_alias(cli, tmp_path):
    args = ["coordinator", "--plan", tmp_path / "p.yaml", "--cluster", tmp_path / "c.yaml", "--profile", tmp_path / "x.json"]
    # a good value: the note, then the run goes on (here to the missing plan file)
    code, _, err = cli(*args, "--timeout", "5")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 2, err
    assert lines[0] == "--timeout is deprecated in `hppctl coordinator`: use --failure-timeout (as `hppctl run` calls it)"
    assert lines[1].startswith("error: ") and "p.yaml" in lines[1]
    # a bad value: the one error line, naming the flag given
    code, _, err = cli(*args, "--timeout", "0.5")
    assert code == 2 and err == "error: --timeout: 0.5 s must exceed --heartbeat 1.0 s (a device is suspect after missing several beats)\n"
    code, _, err = cli(*args, "--timeout", "5", "--failure-timeout", "4")
    assert code == 2 and err == "error: --timeout: deprecated name of --failure-timeout; give only --failure-timeout\n"


def replanned(lost: list[str]) -> RunReplanned:
    return RunReplanned(at=1.0, generation=1, method="light", requested="light", lost=lost, resume_round=7,
                        replan_s=0.05, devices=["a", "c"], stages=[], moved_bytes=0, gathered_bytes=0, layout=0)


def test_events_read_as_one_line_each():
    assert describe(replanned(["b"])) == "re-planned (light) without b in 0.05 s; replaying from round 7"
    assert describe(replanned(["b", "d"])) == "re-planned (light) without b, d in 0.05 s; replaying from round 7"
    # a split-backward run whose survivors cannot defer their weight gradients says so
    dropped = replanned(["b"]).model_copy(update={"split_dropped": "no weight_grad_s for a, c\nin the profile"})
    assert describe(dropped) == ("re-planned (light) without b in 0.05 s; replaying from round 7; whole backwards "
                                 "from now on (no weight_grad_s for a, c\\nin the profile)")
    assert describe(replanned(["b"]).wire()) == describe(replanned(["b"]))  # the --metrics line reads the same
    suspected = DeviceSuspected(at=1.0, generation=0, device="b", silent_s=3.1, why="silent for 3.1 s")
    assert describe(suspected) == "suspected: b silent for 3.1 s"
    resumed = RunResumed(at=1.0, generation=1, round=5, recovery_s=2.31,
                         phases={"stop": 0.01, "move": 0.4, "rebuild": 0.2, "replayed_round": 1.04})
    assert describe(resumed) == ("resumed: round 5 done 2.3 s after the loss was confirmed "
                                 "(longest steps: replayed_round 1.04 s, move 0.40 s, rebuild 0.20 s)")
    assert describe(Armed(at=1.0, generation=0, devices=["a", "b"])) == "armed: failure detection on for a, b"


def test_every_run_event_kind_has_its_line_and_keeps_its_metrics_line():
    kinds = {cls.model_fields["event"].default for cls in get_args(get_args(RunEvent)[0])}
    assert set(DESCRIBE) == kinds
    # the --metrics line: `event`, `at`, `generation` first, then the kind's fields (docs/formats.md)
    line = DeviceLost(at=2.5, generation=1, device="b", reason="probe unanswered").wire()
    assert list(line) == ["event", "at", "generation", "device", "reason"]
    assert describe(json.loads(json.dumps(line))) == "lost: b probe unanswered"


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_standalone_coordinator_runs_a_plan_and_reports_events_and_final_stages(tmp_path, cli, profile):

    from hppctl.store import save

    save(tmp_path / "profile.json", profile)
    (tmp_path / "cluster.yaml").write_text("name: local\ndevices:\n  - {name: a, local: true}\n  - {name: b, local: true}\n")
    assert cli("plan", "--profile", tmp_path / "profile.json", "--global-batch", 16, "--micro-batch", 4,
               "--strategy", "pp", "--out", tmp_path / "plan.yaml")[0] == 0
    code, out, _ = cli("coordinator", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "cluster.yaml",
                       "--profile", tmp_path / "profile.json", "--rounds", 2, "--events", tmp_path / "ev.jsonl", "--json",
                       "--optimizer", "adam", "--lr", "0.003", "--seed", "5")
    summary = json.loads(out)
    assert code == 0 and summary["rounds_run"] == 2 and [e["event"] for e in summary["events"]] == ["armed"]
    assert sorted(d for s in summary["final_stages"] for d in s["devices"]) == ["a", "b"]
    everything = [json.loads(line) for line in (tmp_path / "ev.jsonl").read_text().splitlines()]
    lines = [e for e in everything if e.get("event") != "state"]  # the coordinator's state log, streamed
    assert lines[0]["event"] == "armed" and [r["round"] for r in lines[1:]] == [0, 1]
    assert {e["kind"] for e in everything if e.get("event") == "state"} <= {"heartbeat"}
    assert all(r["backup_bytes"] > 0 for r in lines[1:])
    assert all(r["lr"] == 0.003 for r in lines[1:])  # the training flags reach the workers (before: defaults)
