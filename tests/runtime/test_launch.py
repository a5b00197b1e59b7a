"""Starting and stopping SSH workers: the payload through invoke's stdin loop (fabric's runner), the
remote stop command."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys

import invoke

from hppctl.runtime.launch import _term_then_kill, payload_stream

READ_A_LINE = f"{shlex.quote(sys.executable)} -c 'import sys; print(len(sys.stdin.readline()))'"


def test_a_payload_crosses_invokes_stdin_loop_in_one_read():
    # invoke reads a non-terminal in_stream with read(1) and naps 10 ms between reads: the 3 KB
    # config of a 4-stage lab run reached its workers after 30 s. The same loop runs for fabric's
    # remote runner; here it feeds a local process.
    payload = json.dumps({"token": "t" * 32, "config": {"schedule": "x" * 3000}})
    stream = payload_stream(payload)
    chunks: list[str] = []
    read = stream.read

    def counted(size=-1):
        chunks.append(read(size))
        return chunks[-1]

    stream.read = counted
    result = invoke.Context().run(READ_A_LINE, in_stream=stream, hide=True)
    assert result.stdout.strip() == str(len(payload) + 1)
    assert [c for c in chunks if c] == [payload + "\n"]  # then empty reads (EOF) until the process ends


def _stop_with_sh(pid: int) -> int:
    return subprocess.run(["sh", "-c", _term_then_kill(pid, grace_s=0.5)]).returncode


def test_stopping_a_worker_that_ignores_sigterm_kills_it():
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                 "signal.SIG_IGN); print(flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    stubborn.stdout.readline()  # its handler is set
    assert _stop_with_sh(stubborn.pid) == 0
    assert stubborn.wait(timeout=10) == -signal.SIGKILL


def test_stopping_a_worker_that_is_gone_succeeds():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert _stop_with_sh(gone.pid) == 0
