"""What each kind of run can do: one table (runtime/preflight.py `RUN_KINDS`), printed in
docs/runtime.md "Features", and every refused cell refused by `hppctl run` before any worker starts
(exit 2, one line saying why). Before this table, `--schedule nf1b --profile` trained without fault
tolerance, and `--resume`, `--schedule`, `--rejoin`, `--checkpoint-every` on a psl plan and most
training flags on an inference plan were ignored without a word. No worker is started here."""

from __future__ import annotations

from pathlib import Path

import pytest

from hppctl.cli import run
from hppctl.errors import BadInput
from hppctl.runtime.preflight import FEATURES, RUN_KINDS, check_features, feature_table

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "runtime.md"
EXAMPLES = ROOT / "examples"


@pytest.mark.parametrize("line", feature_table(), ids=lambda line: line.split("|")[1].strip()[:40])
def test_the_docs_table_is_the_preflight_table(line):
    assert line in DOC.read_text().splitlines()


@pytest.mark.parametrize("kind, feature", [(k, f) for k in RUN_KINDS for f in FEATURES])
def test_each_cell_is_refused_or_let_through(kind, feature):
    row = RUN_KINDS[kind]
    if feature not in row.refused:
        check_features(kind, "the plan", {feature: "--flag"})
        return
    with pytest.raises(BadInput) as e:
        check_features(kind, "the plan", {feature: "--flag"})
    assert str(e.value) == f"--flag: the plan, {row.refused[feature]} ({row.doc})"


def test_a_feature_not_asked_for_is_not_refused():
    check_features("inference", "the plan", {f: None for f in FEATURES})


def refused(cli, *argv) -> str:
    code, out, err = cli(*argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and out == "", (code, out, err)
    return lines[0]


@pytest.mark.parametrize("schedule", ["nf1b", "pipedream"])
def test_an_asynchronous_window_refuses_fault_tolerance(cli, schedule):
    """It trained without fault tolerance and said nothing (`--replan light` is the default)."""
    plan = EXAMPLES / "plan-local-pp.yaml"
    line = refused(cli, "run", "--plan", plan, "--cluster", EXAMPLES / "local.yaml", "--profile",
                   EXAMPLES / "local-tiny-cnn.json", "--schedule", schedule, "--epochs", "1")
    assert line.startswith(f"error: --replan: {plan} trained with --schedule {schedule}, which fault tolerance "
                           "cannot recover yet"), line
    assert "--replan off" in line and 'docs/runtime.md, "Features"' in line


@pytest.fixture(scope="module")
def psl_plan(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("psl") / "psl.yaml"
    assert run(["psl", "plan", "--spec", str(EXAMPLES / "psl.yaml"), "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("flags, flag, why", [
    (["--schedule", "nf1b"], "--schedule nf1b", "follows its own order of clients and helpers"),
    (["--replan", "heavy"], "--replan", "cannot survive a lost device"),
    (["--heartbeat", "0.5"], "--heartbeat", "cannot survive a lost device"),
])  # (--trace was refused too until PSL runs traced their batches: tests/psl/test_trace.py; --checkpoint-dir
#     and --resume until PSL runs wrote checkpoints: tests/psl/test_checkpoint.py)
def test_a_psl_plan_refuses_what_it_ignored(cli, psl_plan, tmp_path, flags, flag, why):
    flags = [str(tmp_path / f) if f in ("CK", "T.json") else f for f in flags]
    line = refused(cli, "run", "--plan", psl_plan, "--cluster", EXAMPLES / "psl-cluster.yaml", *flags)
    assert line.startswith(f"error: {flag}: {psl_plan} is a psl plan, which ") and why in line, line
    assert not (tmp_path / "CK").exists()


def test_a_psl_plan_refuses_rejoin_which_only_fault_tolerance_needs(cli, psl_plan, tmp_path):
    line = refused(cli, "run", "--plan", psl_plan, "--cluster", EXAMPLES / "psl-cluster.yaml", "--checkpoint-dir",
                   tmp_path / "CK", "--resume", "--rejoin")
    assert line == "error: --rejoin: not supported for psl plans (see `hppctl psl run --help`)", line
    assert not (tmp_path / "CK").exists()


@pytest.mark.parametrize("flags, flag, why", [
    (["--metrics", "M.jsonl"], "--metrics", "--metrics rows are training rounds"),
    (["--trace", "T.json"], "--trace", "the Chrome trace lays out training rounds"),
    (["--checkpoint-dir", "CK"], "--checkpoint-dir", "no training state to checkpoint"),
    (["--checkpoint-dir", "CK", "--resume"], "--resume", "no training state to resume"),
    (["--schedule", "pipedream"], "--schedule pipedream", "--schedule picks a training schedule"),
    (["--replan", "off"], "--replan", "cannot survive a lost device"),
])
def test_an_inference_plan_refuses_training_features(cli, tmp_path, flags, flag, why):
    plan = EXAMPLES / "galaxy-local.yaml"
    flags = [str(tmp_path / f) if f in ("CK", "T.json", "M.jsonl") else f for f in flags]
    line = refused(cli, "run", "--plan", plan, "--cluster", EXAMPLES / "local.yaml", *flags)
    assert line.startswith(f"error: {flag}: {plan} is an inference (galaxy) plan, which ") and why in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags", [["--rounds", "3"], ["--epochs", "2"], ["--dataset", "digits"],
                                   ["--optimizer", "sgd"], ["--lr", "0.1"], ["--save-model", "MODEL"],
                                   ["--profile", str(EXAMPLES / "local-tiny-cnn.json")],
                                   ["--divergence-factor", "3"]])
def test_an_inference_plan_refuses_training_only_flags(cli, tmp_path, flags):
    plan = EXAMPLES / "galaxy-local.yaml"
    flags = [str(tmp_path / "model.pt") if f == "MODEL" else f for f in flags]
    line = refused(cli, "run", "--plan", plan, "--cluster", EXAMPLES / "local.yaml", *flags)
    assert line == f"error: {flags[0]}: only for training plans; {plan} is an inference (galaxy) plan"
