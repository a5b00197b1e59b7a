"""`hppctl plan` says where the planner is: a rewritten line on a terminal, timestamped lines in a log,
nothing from a forked child, and no thread (a second thread would stop the planner from forking)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hppctl.planner import progress
from hppctl.profiling.synthetic import synthetic_profile
from hppctl.store import save

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ planning for \d+ s: ", re.M)


@pytest.fixture(scope="module")
def large_profile(tmp_path_factory) -> Path:
    """A profile the planner needs a second or more for: 400 layers, 8 devices."""
    path = tmp_path_factory.mktemp("progress") / "profile.json"
    save(path, synthetic_profile(400, [1 + (i % 4) for i in range(8)],
                                 memory_bytes=[(4 + 4 * (i % 2)) * 10**9 for i in range(8)], grid=[1, 2, 4, 8, 16, 32, 64]))
    return path


def plan_args(profile: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "hppctl", "plan", "--profile", str(profile), "--global-batch", "256",
            "--micro-batch", "32", *more]


# -- the planner's side ------------------------------------------------------------------------------

def test_steps_name_the_nested_phases():
    seen = []
    progress.step("before any display")  # nobody listens: nothing happens
    with progress.reporting(seen.append):
        with progress.within("micro-batch 32 (3/7)"), progress.within("asteroid"):
            progress.step("devices 5/16")
        progress.step("after")
    progress.step("gone")
    assert seen == ["micro-batch 32 (3/7)", "micro-batch 32 (3/7) · asteroid",
                    "micro-batch 32 (3/7) · asteroid · devices 5/16", "after"]


def test_a_forked_child_reports_nothing(tmp_path):
    shown = tmp_path / "shown"

    def show(text: str) -> None:
        with shown.open("a") as f:
            f.write(f"{os.getpid()} {text}\n")

    with progress.reporting(show):
        pid = os.fork()
        if pid == 0:  # the child: its steps must not reach the parent's display
            try:
                progress.step("child")
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        progress.step("parent")
    assert shown.read_text() == f"{os.getpid()} parent\n"


def test_the_display_starts_no_thread():
    """planning_progress on a terminal and with a log: steps arrive, and the thread count stays."""
    from hppctl.cli import output
    from hppctl.runtime.progress import ProgressLog

    lines = []
    before = threading.active_count()
    counts = []
    with output.planning_progress(ProgressLog(lines.append, every=0.0), terminal=True):
        progress.step("one")
        counts.append(threading.active_count())
        progress.step("two")
    assert counts == [before]
    assert [line.split(": ", 1)[1] for line in lines] == ["one", "two"]


def test_every_step_reaches_the_terminal_line(capsys):
    """No step is held back: with no thread to write it later, a skipped one would stay unseen through
    the long step after it (a throttled first version showed "micro-batch 16 (5/9)" for the 40 s of a
    bipartition plan, never "· bipartition")."""
    from hppctl.cli.output import StatusLine

    line = StatusLine("planning", clock=lambda: 0.0)
    line.show("micro-batch 16 (5/9)")
    line.show("micro-batch 16 (5/9) · bipartition")
    line.close()
    assert capsys.readouterr().err == ("\r\x1b[Kplanning 0 s · micro-batch 16 (5/9)"
                                       "\r\x1b[Kplanning 0 s · micro-batch 16 (5/9) · bipartition\r\x1b[K")


# -- the command -------------------------------------------------------------------------------------

def run_in_terminal(args: list[str], timeout: float = 120.0) -> tuple[int, str]:
    """Run `args` with stdout and stderr on a pseudo-terminal; (exit code, everything it wrote)."""
    main, child = pty.openpty()
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=child, stderr=child, close_fds=True,
                               env={**os.environ, "COLUMNS": "160", "TERM": "xterm"})
    os.close(child)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([main], [], [], timeout)
            if not ready:
                process.kill()
                raise AssertionError(f"no output for {timeout} s: {b''.join(chunks)[-500:]!r}")
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal closed: the process is done
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(main)
    return process.wait(timeout=timeout), b"".join(chunks).decode(errors="replace")


def test_a_terminal_shows_one_rewritten_line_then_the_plan(large_profile):
    code, text = run_in_terminal(plan_args(large_profile))
    assert code == 0, text
    statuses = re.findall(r"\r\x1b\[K(planning \d+ s · [^\r\n]*)", text)
    assert any("asteroid · memory-order DP · devices" in s for s in statuses), statuses
    assert len(set(statuses)) >= 3, statuses  # rewritten as the plan goes
    # every step is shown: the last one before a long stretch is what a person reads through it
    assert "planning 0 s · asteroid" in statuses[0] and statuses[-1].endswith("moving cuts"), statuses
    # the line is cleared before the plan is printed
    last_status, plan = text.rindex("planning "), text.index("predicted round latency")
    assert last_status < plan and "\r\x1b[K" in text[last_status:plan], text[last_status:plan]


def test_a_log_gets_timestamped_lines_only_for_a_long_plan(large_profile, tmp_path):
    every = subprocess.run(plan_args(large_profile, "--log-every", "0.01"), capture_output=True, text=True,
                           timeout=300)
    assert every.returncode == 0, every.stderr
    lines = STAMP.findall(every.stderr)
    assert len(lines) >= 2, every.stderr
    assert "asteroid · memory-order DP · devices" in every.stderr
    assert "\x1b[K" not in every.stderr  # no terminal control in a log
    default = subprocess.run(plan_args(large_profile), capture_output=True, text=True, timeout=300)
    assert default.returncode == 0, default.stderr
    assert "planning" not in default.stderr  # a plan of seconds: nothing added to a cron job's log
    same = lambda text: re.sub(r"planned in [\d.]+ s", "", text)
    assert same(default.stdout) == same(every.stdout)  # the same plan either way


def test_log_every_refuses_a_bad_interval(large_profile):
    result = subprocess.run(plan_args(large_profile, "--log-every", "0"), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--log-every" in result.stderr and "Traceback" not in result.stderr
