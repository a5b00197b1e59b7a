"""The real feature matrix: every training schedule x {resume after SIGKILL, lose a device mid-run, trace}.

Each cell is a real `hppctl run` on local workers (tiny-mlp, 64 samples, 4 epochs). A cell the one
table (`preflight.RUN_KINDS`, docs/runtime.md "Features") supports must end with the parameters of
the schedule's undisturbed run (`--save-model`, one reference run per schedule); the trace cell also
checks the Chrome trace: one track per device, one optimizer step per device for each mini-batch the
run trained. A cell the table refuses must exit 2 with one line saying why before any worker starts,
and the docs table must print that refusal. The parametrisation is read from `RUN_KINDS`, so a kind
or a refusal added there is a cell here (a new kind without a set-up below fails the test).
tests/runtime/test_feature_matrix.py checks the refusals' wording without a run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hppctl.cli import run
from hppctl.runtime.checkpoint import CheckpointDir
from hppctl.runtime.preflight import FEATURES, RUN_KINDS, feature_table
from hppctl.store import save
from tests.bipartition.factories import bi_plan
from tests.planner.test_split_backward_plan import with_weight_times
from tests.recovery.factories import children, preset_profile
from tests.runtime.factories import local_cluster, make_plan
from tests.runtime.test_split_backward_run import split_plan

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "runtime.md"
EXAMPLES = ROOT / "examples"

DEVICES = ["a", "b", "c"]
EPOCHS = 4
BATCHES_PER_EPOCH = 64 // 16  # tests.runtime.userdata: 64 samples; global batch 16
DATASET = "tests.runtime.userdata:slow_features"  # 5 ms a read in the workers: a run lasts long enough to hurt

DISTURBANCES = {"resume after SIGKILL": "resume", "lose a device": "fault tolerance", "trace": "trace"}
"""Each disturbance and the `FEATURES` entry (a column of the table) it asks for."""

SCHEDULES = [kind for kind in RUN_KINDS if kind != "inference"]
"""Every training kind of run; inference trains nothing (test_feature_matrix checks its refusals)."""

ASYNCHRONOUS = {"nf1b", "pipedream"}

PSL_SPEC = """\
name: matrix-psl
model: tiny-mlp
granularity: fine
cut: [2, 4]
batch: 8
clients:
  - {name: pi, preset: rpi4, count: 3}
helpers:
  - {name: lap, preset: laptop-cpu}
  - {name: nx, preset: jetson-nx}
"""
"""Names as examples/psl-cluster.yaml's devices; tiny-mlp reads `DATASET` (three shards of 21-22 samples)."""


def test_every_training_kind_has_a_set_up():
    assert set(DISTURBANCES.values()) <= set(FEATURES)
    assert set(SCHEDULES) == {"synchronous", "nf1b", "pipedream", "split", "bipartition", "psl"}, \
        "a new kind of run in preflight.RUN_KINDS: give it a plan in `files` below"


def cells():
    for kind in SCHEDULES:
        for disturbance, feature in DISTURBANCES.items():
            supported = feature not in RUN_KINDS[kind].refused
            yield pytest.param(kind, disturbance, supported,
                               id=f"{kind}-{disturbance.replace(' ', '-')}-{'run' if supported else 'refused'}")


# --- the plans ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    """Plan, cluster and profile files of each kind: three single-device stages of tiny-mlp (the
    asynchronous schedules need one device per stage), the same with split backwards, a Bi-Partition
    plan whose first stage backwards fewer layers than it forwards, and a psl plan of tiny-mlp for the
    devices of examples/psl-cluster.yaml."""
    root = tmp_path_factory.mktemp("matrix")
    profile = with_weight_times(preset_profile("tiny-mlp", {"a": "jetson-nano", "b": "jetson-nano", "c": "jetson-tx2"}),
                                0.5)  # so that the split plan's re-plan splits its backwards too
    save(root / "profile.json", profile)
    save(root / "cluster.yaml", local_cluster(*DEVICES))
    digest = {"profile_digest": profile.digest()}  # fault tolerance re-plans from the plan's profile
    layer_wise = make_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 4), ["b"], [4]), ((4, 5), ["c"], [4])],
                           global_batch=16, micro_batch=4).model_copy(update=digest)
    save(root / "plan.yaml", layer_wise)
    save(root / "split.yaml", split_plan(layer_wise))
    save(root / "bi.yaml", bi_plan("tiny-mlp", [0, 3, 4, 5], [0, 2, 5, 5], DEVICES, global_batch=16,
                                   micro_batch=4).model_copy(update=digest))
    (root / "psl-spec.yaml").write_text(PSL_SPEC)
    assert run(["psl", "plan", "--spec", str(root / "psl-spec.yaml"), "--out", str(root / "psl.yaml")]) == 0
    return {"root": root, "profile": root / "profile.json", "cluster": root / "cluster.yaml",
            "plan": root / "plan.yaml", "split": root / "split.yaml", "bi": root / "bi.yaml", "psl": root / "psl.yaml"}


def base_args(kind: str, files: dict) -> list[str]:
    """`hppctl run` of `kind`, before the disturbance's flags."""
    if kind == "psl":  # a round is a batch of each client, then FedAvg: as many rounds as the others' steps
        return ["run", "--plan", str(files["psl"]), "--cluster", str(EXAMPLES / "psl-cluster.yaml"), "--dataset",
                DATASET, "--rounds", str(EPOCHS * BATCHES_PER_EPOCH), "--threads", "1", "--seed", "3"]
    plan = {"bipartition": files["bi"], "split": files["split"]}.get(kind, files["plan"])
    args = ["run", "--plan", str(plan), "--cluster", str(files["cluster"]), "--dataset", DATASET,
            "--epochs", str(EPOCHS), "--threads", "1", "--seed", "3"]
    return args + (["--schedule", kind] if kind in ASYNCHRONOUS else [])


def fault_tolerance_args(files: dict) -> list[str]:
    return ["--profile", str(files["profile"]), "--replan", "light", "--heartbeat", "0.5", "--failure-timeout", "2",
            "--probe-timeout", "1"]


def hppctl(*args, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hppctl", *map(str, args)], **popen)


def finish(args: list, what: str) -> dict:
    """Run `hppctl run ... --json` to its end; its summary."""
    proc = subprocess.run([sys.executable, "-m", "hppctl", *map(str, args), "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, f"{what}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


def assert_same(actual: dict, expected: dict) -> None:
    """The tolerance of the lose-a-device tests (tests/recovery/test_replay.py): Adam turns a near-zero
    gradient into a full step of its sign, so another summation order moves a weight by ~1e-4."""
    assert sorted(actual) == sorted(expected)
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-3, atol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.fixture(scope="module")
def reference(files):
    """The undisturbed run's saved model, per schedule (run once, on first use)."""
    models: dict[str, dict] = {}

    def of(kind: str) -> dict:
        if kind not in models:
            out = files["root"] / f"reference-{kind}.pt"
            finish([*base_args(kind, files), "--save-model", out], f"the undisturbed {kind} run")
            models[kind] = torch.load(out)
        return models[kind]
    return of


# --- the disturbances -----------------------------------------------------------------------------

def resumed_after_sigkill(kind: str, files: dict, tmp_path: Path) -> dict:
    """Kill the launcher (SIGKILL) once a round (an epoch, under an asynchronous schedule) is
    checkpointed, start it again with `--resume`: the resumed run's saved model."""
    ck = CheckpointDir(tmp_path / "ck")
    args = base_args(kind, files) + ["--checkpoint-dir", ck.path]
    total = EPOCHS if kind in ASYNCHRONOUS else EPOCHS * BATCHES_PER_EPOCH
    first = 1 if kind in ASYNCHRONOUS else 3
    killed = hppctl(*args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: ck.complete_rounds() and ck.complete_rounds()[-1] >= first, killed, "a checkpoint")
    finally:
        killed.kill()
        killed.wait()
    reached = ck.complete_rounds()[-1]
    assert reached < total, "the run ended before it was killed"
    summary = finish([*args, "--resume", "--save-model", tmp_path / "resumed.pt"], "the resumed run")
    assert summary["start_round"] >= reached and summary["rounds_run"] == total - summary["start_round"]
    return torch.load(tmp_path / "resumed.pt")


def lost_a_device(kind: str, files: dict, tmp_path: Path) -> dict:
    """SIGKILL one worker once round 2 is reported; the run re-plans without it and finishes. A run
    that finished before the kill landed tested nothing and is run again (at most 3 times)."""
    for _ in range(3):
        summary = run_and_kill_a_worker(kind, files, tmp_path)
        lost = [e["device"] for e in summary["events"] if e["event"] == "lost"]
        if lost:
            replanned = [e for e in summary["events"] if e["event"] == "replanned"]
            assert replanned, summary["events"]
            # a split run keeps splitting (the profile has weight-gradient times); the others never split
            assert all(e["split_backward"] == (kind == "split") and e["split_dropped"] == "" for e in replanned)
            assert not set(lost) & {d for s in summary["final_stages"] for d in s["devices"]}, summary["final_stages"]
            assert summary["rounds_run"] == EPOCHS * BATCHES_PER_EPOCH
            return torch.load(tmp_path / "model.pt")
    pytest.fail("a worker was killed and nothing was lost, 3 runs in a row")


def run_and_kill_a_worker(kind: str, files: dict, tmp_path: Path) -> dict:
    metrics = tmp_path / "m.jsonl"
    metrics.unlink(missing_ok=True)
    args = [*base_args(kind, files), *fault_tolerance_args(files), "--metrics", metrics,
            "--save-model", tmp_path / "model.pt", "--json"]
    launcher = hppctl(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: reported_round(metrics) >= 2, launcher, "round 2")
        workers = local_workers(launcher.pid)
        assert len(workers) == len(DEVICES), workers
        os.kill(workers[1], signal.SIGKILL)  # any one: every stage is a single device, each can be re-planned away
        out, err = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 0, err[-3000:]
    return json.loads(out)


def traced(kind: str, files: dict, tmp_path: Path) -> dict:
    """A run with `--trace`: the trace lays out the run, and tracing leaves the parameters alone."""
    trace = tmp_path / "trace.json"
    args = [*base_args(kind, files), "--trace", trace, "--save-model", tmp_path / "model.pt"]
    summary = finish(args, "the traced run")
    if kind == "psl":
        assert_psl_trace(json.loads(trace.read_text()), summary)
    else:
        assert_chrome_trace(json.loads(trace.read_text()), rounds=summary["rounds_run"],
                            steps=EPOCHS * BATCHES_PER_EPOCH)
    return torch.load(tmp_path / "model.pt")


def assert_psl_trace(doc: dict, summary: dict) -> None:
    """A PSL run's trace, laid out as `hppctl psl simulate --trace`: one row per client and helper;
    per batch, each client's three steps and each helper's two tasks per client it serves; one
    FedAvg per device and round; every span within the run."""
    events = doc["traceEvents"]
    rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]
    assert doc["otherData"]["rounds"] == summary["rounds"]
    batches = summary["batches"]
    served = {h: 0 for h in summary["helper_orders"]}
    for client in summary["clients"].values():
        served[client["helper"]] += 1
    assert sorted(rows.values()) == sorted([*summary["clients"], *served])
    for tid, device in rows.items():
        mine = [e for e in spans if e["tid"] == tid]
        kinds = [e["cat"] for e in mine]
        assert kinds.count("fedavg") == summary["rounds"], device
        if device in summary["clients"]:
            assert kinds.count("client") == 3 * batches, device
        else:
            assert kinds.count("helper-F") == kinds.count("helper-B") == served[device] * batches, device
        assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in mine), device


def assert_chrome_trace(doc: dict, *, rounds: int, steps: int) -> None:
    """Chrome's trace-event format: complete events (ph X) with ts/dur in microseconds on (pid, tid)
    tracks named by metadata events. One device track per worker, each with one optimizer step per
    mini-batch trained (a round, or one of an asynchronous epoch's mini-batches)."""
    events = doc["traceEvents"]
    assert doc["otherData"]["rounds"] == rounds
    named = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    processes = {e["args"]["name"]: e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    devices = {tid: name for (pid, tid), name in named.items() if pid == processes["devices"]}
    assert sorted(name.split(": ")[1].split(" ")[0] for name in devices.values()) == DEVICES, devices
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all((e["pid"], e["tid"]) in named for e in spans)
    assert all(e["ts"] >= 0 and e["dur"] >= 0 and isinstance(e["name"], str) for e in spans)
    for tid, name in devices.items():
        mine = [e for e in spans if (e["pid"], e["tid"]) == (processes["devices"], tid)]
        assert sum(e["cat"] == "step" for e in mine) == steps, name
        assert {"forward", "backward"} <= {e["cat"] for e in mine}, name


DISTURB = {"resume after SIGKILL": resumed_after_sigkill, "lose a device": lost_a_device, "trace": traced}


def wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} in {timeout} s"
        time.sleep(0.02)


def reported_round(metrics: Path) -> int:
    """The highest round in a `--metrics` file being written (-1: none yet)."""
    if not metrics.exists():
        return -1
    rounds = [json.loads(line).get("round", -1) for line in metrics.read_text().splitlines()
              if line.endswith("}")]  # a line being written is not complete yet
    return max(rounds, default=-1)


def local_workers(launcher: int) -> list[int]:
    """The launcher's worker processes, in the order they were started: the children of the zygote
    it forks them from (hppctl/runtime/zygote.py), or its own children other than the zygote."""
    below = children(launcher)
    forked = [pid for zygote in below for pid in children(zygote)]
    return sorted(forked or below)


# --- the matrix -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, disturbance, supported", list(cells()))
def test_cell(kind, disturbance, supported, files, reference, tmp_path, cli):
    if supported:
        assert_same(DISTURB[disturbance](kind, files, tmp_path), reference(kind))
    else:
        assert_refused(kind, DISTURBANCES[disturbance], files, tmp_path, cli)


def assert_refused(kind: str, feature: str, files: dict, tmp_path: Path, cli) -> None:
    """Exit 2, one line naming why (the table's words and the doc that explains them), nothing
    written; and the docs table prints the refusal."""
    row = RUN_KINDS[kind]
    flags = {"resume": ["--checkpoint-dir", tmp_path / "ck", "--resume"],
             "fault tolerance": fault_tolerance_args(files),
             "trace": ["--trace", tmp_path / "trace.json"]}[feature]
    code, out, err = cli(*base_args(kind, files), *flags, "--save-model", tmp_path / "model.pt")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and out == "", (code, out, err)
    assert lines[0].startswith("error: --") and lines[0].endswith(f"{row.refused[feature]} ({row.doc})"), lines[0]
    assert list(tmp_path.iterdir()) == []
    table = feature_table()
    line = next(line for line in table[2:] if line.startswith(f"| {row.label} |"))
    cell = line.strip("|").split(" | ")[1 + FEATURES.index(feature)]
    assert cell.startswith("refused: ") and cell.removeprefix("refused: ") in row.refused[feature], cell
    assert line in DOC.read_text().splitlines(), f"docs/runtime.md \"Features\" lacks: {line}"
