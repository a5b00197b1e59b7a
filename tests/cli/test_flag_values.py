"""Every numeric flag refuses NaN, ±inf, 0 or negatives where meaningless, 1e400, 1e-300 where too small
to work, and huge whole numbers, in one line naming the flag, before any file is read or process
started (issue 23, item 7). The cluster lacks device `b`, so a flag that slipped through would be
reported as the cluster's error instead, and nothing could ever start."""

from __future__ import annotations

import json

import pytest

from hppctl.cli import run
from hppctl.models.plan import PlanRequest
from hppctl.planner import make_plan
from hppctl.store import save
from tests.conftest import make_profile
from tests.runtime.factories import local_cluster, make_plan as hand_plan

BAD_SECONDS = ["nan", "inf", "-inf", "0", "-1", "1e400", "1e-300", "1e300"]
BAD_COUNTS = ["0", "-1", str(10**30), str(2**63)]
BAD_THREADS = ["0", "-1", "1025", "1000000000", str(10**30)]
BAD_SEEDS = ["-1", str(2**32), str(10**30)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flags")
    profile = make_profile(layers=5, speeds=(1, 2, 3))
    save(tmp / "p.json", profile)
    save(tmp / "plan.yaml", make_plan(profile, PlanRequest(global_batch=16, micro_batch=4)))
    save(tmp / "train.yaml", hand_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])],
                                       global_batch=16, micro_batch=4))
    save(tmp / "a-only.yaml", local_cluster("a"))
    (tmp / "preset.yaml").write_text("name: c\ndevices:\n- {name: a, preset: jetson-nano}\n")
    assert run(["psl", "plan", "--profile", str(tmp / "p.json"), "--clients", "dev0,dev1", "--helpers", "dev2",
                "--cut", "2,4", "--batch", "8", "--out", str(tmp / "psl.yaml")]) == 0
    return tmp


COMMANDS = {
    "run": ["run", "--plan", "{t}/train.yaml", "--cluster", "{t}/a-only.yaml"],
    "coordinator": ["coordinator", "--plan", "{t}/train.yaml", "--cluster", "{t}/a-only.yaml", "--profile", "{t}/p.json"],
    "simulate": ["simulate", "--plan", "{t}/plan.yaml", "--profile", "{t}/p.json"],
    "simulate --fail": ["simulate", "--plan", "{t}/plan.yaml", "--profile", "{t}/p.json", "--fail", "nope@1"],
    "profile": ["profile", "--cluster", "{t}/preset.yaml", "--model", "tiny-cnn", "--json"],
    "psl simulate": ["psl", "simulate", "--plan", "{t}/psl.yaml"],
    "psl plan": ["psl", "plan", "--profile", "{t}/p.json", "--clients", "dev0,dev1", "--helpers", "dev2", "--cut", "2,4"],
    "plan": ["plan", "--profile", "{t}/p.json", "--global-batch", "16", "--micro-batch", "4"],
}
CASES = [
    ("run", "--timeout", BAD_SECONDS), ("run", "--threads", BAD_THREADS), ("run", "--seed", BAD_SEEDS),
    ("run", "--heartbeat", BAD_SECONDS), ("run", "--failure-timeout", BAD_SECONDS),
    ("run", "--probe-timeout", BAD_SECONDS), ("run", "--rounds", BAD_COUNTS), ("run", "--epochs", BAD_COUNTS),
    ("run", "--checkpoint-every", BAD_COUNTS), ("run", "--replicate-every", BAD_COUNTS),
    ("run", "--lr", ["nan", "inf", "0", "-1", "1e400"]),
    ("coordinator", "--failure-timeout", BAD_SECONDS), ("coordinator", "--timeout", BAD_SECONDS),
    ("coordinator", "--heartbeat", BAD_SECONDS),
    ("coordinator", "--probe-timeout", BAD_SECONDS), ("coordinator", "--seed", BAD_SEEDS),
    ("coordinator", "--rounds", BAD_COUNTS),
    ("simulate", "--step-time", ["nan", "inf", "-1", "1e400", "1e300"]),
    ("simulate --fail", "--timeout", BAD_SECONDS), ("simulate --fail", "--replicate-every", ["-1", str(10**30)]),
    ("profile", "--timeout", BAD_SECONDS), ("profile", "--link-seconds", BAD_SECONDS),
    ("profile", "--threads", BAD_THREADS), ("profile", "--repeats", BAD_COUNTS),
    ("psl plan", "--target-slots", ["0", "100001", str(10**9)]),
    ("psl simulate", "--slow", ["dev2=inf", "dev2=nan", "dev2=-1", "dev2=0"]),
    ("plan", "--global-batch", ["0", "-1", str(10**30)]), ("plan", "--micro-batch", ["0", str(2**63)]),
]


@pytest.mark.parametrize("command, flag, value", [pytest.param(c, f, v, id=f"{c} {f} {v[:12]}")
                                                  for c, f, values in CASES for v in values])
def test_bad_numeric_flags_are_one_line_naming_the_flag(cli, files, command, flag, value):
    argv = [a.format(t=files) for a in COMMANDS[command]] + [flag, value]
    code, out, err = cli(*argv)
    # with --json, stdout holds the JSON error document (exit-code contract, docs/architecture.md)
    assert code == 2 and (json.loads(out)["error"]["code"] == 2 if "--json" in argv else out == ""), err
    assert err.startswith(f"error: {flag}: ") and len(err.strip().splitlines()) == 1, err
    assert len(err) < 300  # a 31-digit value is cut, not repeated


def test_timeouts_and_threads_state_their_bounds_in_the_help(cli):
    code, out, _ = cli("run", "--help")
    flat = " ".join(out.split())
    assert code == 0 and "(1 to 2592000, 30 days)" in flat and "at most 1024" in flat and "0 to 2^32 - 1" in flat


@pytest.mark.parametrize("when", ["nan", "inf", "-1", "1e300"])
def test_a_failure_time_is_finite_and_bounded(cli, files, when):
    code, _, err = cli("simulate", "--plan", files / "plan.yaml", "--profile", files / "p.json", "--fail", f"dev1@{when}")
    assert code == 2 and err.startswith("error: --fail: SECONDS must be from 0 to 2592000") and len(err.splitlines()) == 1


@pytest.mark.parametrize("flag, value", [("--input-ids", "ids.json"), ("--input", "hello"), ("--seq-len", "8"),
                                         ("--repeat", "3"), ("--output", "h.pt"), ("--wire-dtype", "float16"),
                                         ("--no-overlap", None)])
def test_inference_flags_on_a_training_plan_are_refused(cli, files, flag, value):
    """`--input-ids` on a training plan was silently ignored: the run trained as if it were not given."""
    extra = [flag] if value is None else [flag, value]
    code, out, err = cli("run", "--plan", files / "train.yaml", "--cluster", files / "a-only.yaml", *extra)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: {flag}: only for inference (galaxy) plans; ") and "hpp training plan" in err


@pytest.mark.parametrize("dataset, needle", [
    ("os:system", "not a dataset factory"),  # was a TypeError traceback (system() needs a command)
    ("os:abort", "not a dataset factory"),  # would have killed the CLI with SIGABRT
    ("builtins:input", "not a dataset factory"),  # would have waited on stdin
    ("json:loads", "called with no arguments"),
    ("collections:OrderedDict", "got OrderedDict"),
    ("builtins:list", "the training set is empty"),
    ("tests.cli.test_flag_values:text_factory", "got str"),  # text has a length and items too
    ("tests.cli.test_flag_values:raising_factory", "the factory failed: RuntimeError: no data here"),
    ("tests.cli.test_flag_values:not_pairs", "cannot read sample 0 as an (input, label) pair"),
])
def test_a_dataset_that_is_not_a_dataset_factory_is_one_line(cli, tmp_path, dataset, needle):
    save(tmp_path / "plan.yaml", hand_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])],
                                           global_batch=16, micro_batch=4))
    save(tmp_path / "c.yaml", local_cluster("a", "b"))  # complete: the dataset is the last pre-flight check
    code, out, err = cli("run", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "c.yaml",
                         "--dataset", dataset)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: --dataset {dataset}: ") and needle in err, err


def text_factory():
    return "/home/user"


def raising_factory():
    raise RuntimeError("no data here")


def not_pairs():
    return [None, None]
