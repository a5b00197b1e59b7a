"""hppctl/shutdown.py: an exit without the collector's shutdown passes still does what an exit does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import atexit, sys
from hppctl.shutdown import exit_process
atexit.register(lambda: print("atexit ran"))
left_open = open(sys.argv[1], "w")
left_open.write("buffered, never flushed by the script")
cycle = []
cycle.append(cycle)
sys.stdout.write("unterminated line ")
exit_process(3)
"""


def test_exit_process_keeps_the_exit_code_the_atexit_handlers_and_the_buffered_output(tmp_path):
    out = tmp_path / "written.txt"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 3, done.stderr
    assert done.stdout == "unterminated line atexit ran\n"
    assert out.read_text() == "buffered, never flushed by the script"
