"""Local workers: forked by the launcher's zygote (the default) or started as `python -m` (exec).

Both must give a worker the same things: the payload on stdin, the launcher's environment plus the
run's, the launcher's directory, `__main__` semantics, its own session, its output and exit code,
and signals to its own pid. The module is a stand-in (`echo_worker`) so that each case takes
milliseconds once the zygote runs; the real workers go through the same path in every gloo test.
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

from hppctl.errors import BadInput
from hppctl.runtime.launch import LOCAL_START_ENV, LocalWorker

MODULE = "tests.runtime.echo_worker"

pytestmark = pytest.mark.timeout(120)


REPO = str(Path(__file__).parents[2])


def start(payload: dict, **env: str) -> LocalWorker:
    # PYTHONPATH: the stand-in is found from any directory (a worker's sys.path starts with its cwd)
    return LocalWorker("w", json.dumps(payload), env={"PYTHONPATH": REPO, **env}, module=MODULE)


def echoed(worker: LocalWorker) -> dict:
    deadline = time.monotonic() + 60
    while not worker.tail() and time.monotonic() < deadline:
        time.sleep(0.01)
    return json.loads(worker.tail()[0])


def wait(worker: LocalWorker) -> int:
    code = worker.proc.wait(timeout=60)
    assert worker.poll() == code
    return code


@pytest.fixture(params=["fork", "exec"])
def mode(request, monkeypatch):
    monkeypatch.setenv(LOCAL_START_ENV, request.param)
    return request.param


def test_a_worker_gets_its_payload_environment_directory_and_session(mode, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the launcher's directory at the time of the start, not the zygote's
    worker = start({"exit": 3, "x": [1, 2]}, HPPCTL_ECHO=mode)
    assert wait(worker) == 3
    seen = echoed(worker)
    assert seen == {"payload": {"exit": 3, "x": [1, 2]}, "env": mode, "cwd": str(tmp_path), "name": "__main__",
                    "session_leader": True}


def test_a_worker_whose_thread_settings_differ_from_the_launchers_gets_its_own(mode):
    # OMP_NUM_THREADS is read when torch starts: a worker forked from a zygote started with another
    # value kept the zygote's thread count. Each start-up environment has its own zygote, so such a
    # worker is still forked (a launcher whose environment changed fell back to exec for every worker).
    import os

    wanted = "1" if os.environ.get("OMP_NUM_THREADS") != "1" else "2"
    worker = start({"threads": True}, OMP_NUM_THREADS=wanted)
    assert wait(worker) == 0
    assert json.loads(worker.tail()[1])["threads"] == int(wanted)
    assert type(worker.proc).__name__ == ("ForkedProcess" if mode == "fork" else "Popen")


def test_signals_reach_the_worker_and_its_exit_code_says_so(mode):
    worker = start({"sleep": 60})
    echoed(worker)
    worker.proc.send_signal(signal.SIGSTOP)  # a frozen worker is still running
    time.sleep(0.2)
    assert worker.poll() is None
    worker.proc.kill()
    assert wait(worker) == -signal.SIGKILL


def test_stop_ends_a_running_worker(mode):
    worker = start({"sleep": 60})
    echoed(worker)
    worker.stop()
    assert worker.poll() == -signal.SIGTERM


def test_an_unknown_start_mode_is_named(monkeypatch):
    monkeypatch.setenv(LOCAL_START_ENV, "spawn")
    with pytest.raises(BadInput, match="HPPCTL_LOCAL_START='spawn': expected fork or exec"):
        start({})


def test_a_script_without_a_main_guard_is_not_run_again_and_a_thread_may_start_the_zygote(tmp_path):
    # multiprocessing's forkserver re-imports the launcher's __main__ in every child; a user's script
    # around Session without `if __name__ == "__main__"` would start its run again in each worker.
    # The worker is started from a thread that ends at once: a zygote bound to that thread's life
    # (PR_SET_PDEATHSIG) would die with it and take the worker along (exit -15).
    script = tmp_path / "launcher.py"
    script.write_text(
        "import json, sys, threading, time\n"
        f"sys.path.insert(0, {REPO!r})\n"
        "from hppctl.runtime.launch import LocalWorker\n"
        "print('launcher body ran', flush=True)\n"
        "started = []\n"
        f"t = threading.Thread(target=lambda: started.append(LocalWorker('w', json.dumps({{'sleep': 1}}), module={MODULE!r})))\n"
        "t.start(); t.join()\n"
        "w = started[0]\n"
        "assert w.proc.wait(timeout=60) == 0, w.proc.poll()\n"
        "time.sleep(0.2)\n"
        "print(w.tail()[0], flush=True)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("launcher body ran") == 1
    assert json.loads(out.stdout.splitlines()[-1])["name"] == "__main__"


def test_the_real_worker_module_says_only_its_own_words(mode):
    # The zygote imported hppctl.runtime.worker before forking, so runpy warned, in every worker's
    # output, that it found the module in sys.modules (a failure's "last lines" included).
    worker = LocalWorker("w", json.dumps({"bad": 1}))
    assert wait(worker) == 2
    assert [line.strip() for line in worker.tail() if line.strip()] == [
        "error: worker needs one JSON line {token, config} on stdin ('token')"]


def test_a_zygote_whose_launcher_leaves_while_it_imports_ends_at_once():
    """A run refused after it started the zygote early (cli/run_cmd.py) must not leave it importing torch
    with the launcher's output open. Here the launcher is a process that starts a zygote whose preload
    takes a minute and exits at once: its output reaches EOF only once the zygote, which holds it too, has
    ended, long before the import would have (the 30 s is a hang bound)."""
    launcher = ("import os; from hppctl.runtime.zygote import Zygote; "
                f"Zygote(['tests.runtime.slow_import'], dict(os.environ, PYTHONPATH={REPO!r})); print('started')")
    done = subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert done.returncode == 0 and done.stdout == "started\n", done.stderr


def test_the_zygote_imports_on_the_thread_it_forks_from(tmp_path):
    """Importing torch makes MKL account a buffer by thread id. The zygote imported its preload on a thread
    that then ended, so every worker inherited MKL's record of a dead thread id, and under heavy load
    zygote-forked workers spun forever in MKL's `mm_account_ptr_by_tid` (docs/runtime.md). The preload now
    runs on the main thread, the one that forks; before, this probe read "preload"."""
    from hppctl.runtime.zygote import Zygote

    out = tmp_path / "thread"
    zygote = Zygote(["tests.runtime.import_thread_probe"],
                    dict(os.environ, PYTHONPATH=str(REPO), IMPORT_THREAD_PROBE_OUT=str(out)))
    try:
        deadline = time.monotonic() + 60  # a hang bound: the probe imports nothing heavy
        while not (out.exists() and out.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out.read_text() == "main"
    finally:
        zygote.proc.kill()
        zygote.proc.wait()


def test_torchs_own_cache_variable_does_not_ask_for_a_second_zygote():
    """torch writes TORCHINDUCTOR_CACHE_DIR into the launcher's environment once inductor's cache is used,
    which can happen after the run started its zygote: the same start-up environment all the same."""
    from hppctl.runtime.zygote import startup_env

    base = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin"}
    assert startup_env({**base, "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_root"}) == startup_env(base)
    assert startup_env({**base, "OMP_NUM_THREADS": "2"}) != startup_env(base)


@pytest.mark.parametrize("warm, traced", [(["tiny-mlp"], True), ([], False), (["no-such-model", "tiny-mlp"], True)])
def test_a_worker_inherits_the_trace_its_zygote_warmed(warm, traced):
    """Every worker of a run builds its stage from the model's trace: for mobilenetv2, ~4 s of CPU each
    (transformers' model class and the meta trace) before its first round. The zygote now traces the
    run's built-in model once and its forks start with it; a model it cannot trace is skipped (the
    worker reports it)."""
    from hppctl.runtime.zygote import Zygote

    zygote = Zygote(["hppctl.zoo"], dict(os.environ, PYTHONPATH=str(REPO)), warm)
    read, write = os.pipe()
    try:
        child = zygote.fork("tests.runtime.trace_probe", "", dict(os.environ, PYTHONPATH=str(REPO)), REPO, write)
        os.close(write)
        with os.fdopen(read) as out:
            said = out.read()
        assert child.wait(timeout=60) == 0, said
        assert json.loads(said.splitlines()[-1]) == {"traced": traced}
    finally:
        zygote.proc.kill()
        zygote.proc.wait()


def test_only_a_built_in_model_is_warmed():
    from hppctl.runtime.launch import models_to_warm

    assert models_to_warm("mobilenetv2") == ["mobilenetv2"] and models_to_warm("hf:models/tiny-bert") == ["hf:models/tiny-bert"]
    assert models_to_warm("examples.mynet:make") == [] and models_to_warm(None) == []


def test_the_cli_forks_its_zygote_from_itself_and_the_zygote_keeps_none_of_its_descriptors(tmp_path):
    """`python -m hppctl run`: the launcher does the zygote's imports itself (it needs them for its own
    checks) and forks the zygote from that state, instead of a fresh interpreter importing torch and
    torch._dynamo again (~3.6 s of CPU per run on the 2-core VM of 2026-11-27). The fork must keep none
    of the launcher's descriptors but its socket and output (a held lock or log file, or the launcher's
    end of the socket, whose EOF is how the zygote learns the launcher died), run in a session of its
    own, and end with the launcher and its workers."""
    from tests.recovery.factories import children
    from tests.runtime.factories import start_endless_two_device_run
    from tests.runtime.test_schedule_matrix import reported_round, wait_for

    launcher, metrics = start_endless_two_device_run(tmp_path, "--checkpoint-dir", tmp_path / "ck", "--log",
                                                     tmp_path / "log.txt")
    try:
        wait_for(lambda: reported_round(metrics) >= 1, launcher, "round 1")
        zygotes = [pid for pid in children(launcher.pid) if children(pid)]
        assert len(zygotes) == 1, zygotes
        zygote = zygotes[0]
        assert Path(f"/proc/{zygote}/cmdline").read_bytes() == Path(f"/proc/{launcher.pid}/cmdline").read_bytes()
        assert os.getsid(zygote) == zygote
        held = {int(fd): os.readlink(f"/proc/{zygote}/fd/{fd}") for fd in os.listdir(f"/proc/{zygote}/fd")}
        assert held[0] == os.devnull
        assert held[1] == os.readlink(f"/proc/{launcher.pid}/fd/1")
        assert held[2] == os.readlink(f"/proc/{launcher.pid}/fd/2")
        others = {fd: target for fd, target in held.items() if fd > 2}
        assert len(others) == 1 and next(iter(others.values())).startswith("socket:"), held
        workers = children(zygote)
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 30  # a hang bound
        while any(Path(f"/proc/{pid}").exists() and not _zombie(pid) for pid in [zygote, *workers]):
            assert time.monotonic() < deadline, "the zygote or a worker outlived the launcher"
            time.sleep(0.1)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_the_zygote_is_forked_from_here_only_by_the_cli_on_its_only_thread_with_its_own_environment():
    """A library caller's process (a test, a user's script) may hold threads, locks, modules and used
    OpenMP threads a fork would copy half-made: its zygote is a fresh interpreter, as is one for another
    start-up environment, one started from a thread, and one a run command did not ask for. Asked in a
    fresh interpreter: this test's own process (a pytest-xdist worker) runs threads of its own."""
    probe = """
import json, os, threading
from hppctl.runtime import zygote
env = dict(os.environ)
seen = {"library": zygote.may_fork_from_here(env)}
zygote.this_process_is_a_launcher()
seen["cli"] = zygote.may_fork_from_here(env)
seen["other environment"] = zygote.may_fork_from_here({**env, "OMP_NUM_THREADS": str(int(env.get("OMP_NUM_THREADS", "1")) + 7)})
helper = threading.Thread(target=lambda: seen.update(thread=zygote.may_fork_from_here(env)))
helper.start(); helper.join()
stop = threading.Event()
other = threading.Thread(target=stop.wait); other.start()
seen["another thread running"] = zygote.may_fork_from_here(env)
stop.set(); other.join()
print(json.dumps(seen))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"library": False, "cli": True, "other environment": False, "thread": False,
                                       "another thread running": False}
