"""The exit-code contract (issue 25, item 7): one table (`hppctl.errors.EXIT_CODES`, printed in
docs/architecture.md), `--json` errors as a JSON document on stdout, quiet broken pipes, `--png`
without matplotlib as bad input, a held checkpoint lock as "another run is active" (75).

CLI-level symptoms are checked through the real command in a subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hppctl.errors import EXIT_CODES, BadInput, Diverged, HppctlError, Infeasible, LockHeld, RuntimeFailure
from hppctl.runtime.checkpoint import CheckpointDir, CheckpointLocked
from hppctl.store import save
from tests.conftest import make_profile
from tests.runtime.factories import local_cluster, make_plan

ROOT = Path(__file__).resolve().parents[2]


def hppctl(*argv, env_extra: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "hppctl", *map(str, argv)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


# --- the one table ---------------------------------------------------------------------------------

def test_every_error_type_has_a_code_of_the_table():
    kinds = {kind: code for code, kind, _ in EXIT_CODES}
    for error in (HppctlError, RuntimeFailure, BadInput, Infeasible, LockHeld, Diverged):
        assert kinds[error.kind] == error.exit_code
    assert len(kinds) == len(EXIT_CODES) == len({code for code, _, _ in EXIT_CODES})
    assert issubclass(CheckpointLocked, LockHeld)


def test_docs_table_is_the_code_table():
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", text, flags=re.M)
    assert [(int(code), kind) for code, kind in rows] == [(code, kind) for code, kind, _ in EXIT_CODES]
    readme = (ROOT / "README.md").read_text()
    for code, kind, _ in EXIT_CODES:
        if code not in (0, 130):
            assert f"{code} {kind.replace('_', ' ')}" in readme, (code, kind)


# --- --json errors ---------------------------------------------------------------------------------

def test_json_error_is_a_document_on_stdout(tmp_path):
    done = hppctl("simulate", "--plan", tmp_path / "missing.yaml", "--profile", tmp_path / "p.json", "--json")
    assert done.returncode == 2
    doc = json.loads(done.stdout)
    assert doc["error"]["code"] == 2 and doc["error"]["kind"] == "bad_input"
    assert "missing.yaml" in doc["error"]["message"]
    assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1


def test_json_usage_error_is_a_document_too(cli):
    code, out, err = cli("models", "--json", "--no-such-flag")
    assert code == 2 and json.loads(out)["error"]["kind"] == "bad_input" and err.startswith("error: ")


def test_without_json_stdout_stays_empty(cli, tmp_path):
    code, out, err = cli("simulate", "--plan", tmp_path / "missing.yaml", "--profile", tmp_path / "p.json")
    assert code == 2 and out == "" and err.startswith("error: ")


# --- broken pipes ----------------------------------------------------------------------------------

def test_a_reader_that_went_away_ends_the_command_quietly():
    """`hppctl models | head -1`, made deterministic: the pipe's read end is closed before hppctl writes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "hppctl", "models"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=ROOT)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert err == ""


def test_head_in_a_shell_pipeline_sees_no_traceback():
    done = subprocess.run(f"{sys.executable} -m hppctl models | head -1; echo \"rc=${{PIPESTATUS[0]}}\"",
                          shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert "Traceback" not in done.stderr and "error" not in done.stderr
    assert re.search(r"rc=(0|141)$", done.stdout.strip())


# --- --png without matplotlib ----------------------------------------------------------------------

MATPLOTLIB_BLOCKER = textwrap.dedent('''
    # sitecustomize for a test: a meta-path blocker that makes `import matplotlib` fail as if it
    # were not installed.
    import sys

    class MatplotlibBlocker:
        def find_spec(self, name, path=None, target=None):
            if name == "matplotlib" or name.startswith("matplotlib."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, MatplotlibBlocker())
''')


def test_png_without_matplotlib_is_bad_input(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(MATPLOTLIB_BLOCKER)
    save(tmp_path / "p.json", make_profile(layers=6, speeds=(1.0, 2.0)))
    made = hppctl("plan", "--profile", tmp_path / "p.json", "--global-batch", "16", "--micro-batch", "4", "--out", tmp_path / "plan.yaml")
    assert made.returncode == 0, made.stderr
    trace = tmp_path / "t.json"
    done = hppctl("simulate", "--plan", tmp_path / "plan.yaml", "--profile", tmp_path / "p.json",
                  "--png", tmp_path / "c.png", "--trace", trace,
                  env_extra={"PYTHONPATH": f"{blocker}{os.pathsep}{ROOT}"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "error: --png needs matplotlib: pip install 'hppctl[plot]'"
    assert not trace.exists() and not (tmp_path / "c.png").exists()  # refused before any work


# --- a held checkpoint lock ------------------------------------------------------------------------

@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_held_lock_exits_75_with_one_line(tmp_path):
    plan = make_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])], global_batch=16, micro_batch=4)
    save(tmp_path / "plan.yaml", plan)
    save(tmp_path / "cluster.yaml", local_cluster("a", "b"))
    holder = CheckpointDir(tmp_path / "ck")  # the same lock function a live run takes
    holder.lock()
    try:
        done = hppctl("run", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "cluster.yaml",
                      "--checkpoint-dir", tmp_path / "ck", "--resume", timeout=240)
    finally:
        holder.unlock()
    assert done.returncode == 75, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --checkpoint-dir") and "in use by another run" in lines[0]
    assert CheckpointDir(tmp_path / "ck").complete_rounds() == []
