"""A fork server for local workers: torch is imported once, each worker is a fork of that process.

Why: a local worker started as `python -m hppctl.runtime.worker` spent 4-6 s of CPU importing torch
and torch._dynamo (the meta trace's kernels import it) before it could join. A 3-worker local
run on a 2-core machine waited 10 s for its first round, most of it those imports. The zygote
imports them once, then forks one child per worker: the child is still its own process (own pid,
own session, `python -m` semantics: the module runs as `__main__`, its payload on stdin).

Not `multiprocessing`'s forkserver: that one re-imports the launcher's `__main__` in every child,
which re-runs a user's script that has no `if __name__ == "__main__"` guard.

Protocol, over one AF_UNIX stream socket pair (launcher <-> zygote):
- launcher -> zygote: an 8-byte big-endian length with the worker's output pipe (write end)
  attached as SCM_RIGHTS, then that many bytes of JSON {id, module, payload, env, cwd};
- zygote -> launcher: JSON lines {"id", "pid"} once a worker is forked, {"pid", "code"} once it
  has ended (code as `subprocess` gives it: negative for a signal).
The zygote ends when the launcher's end closes or is reset (the launcher exited or died); its children get
SIGTERM then (PR_SET_PDEATHSIG), as `python -m` workers do when their launcher dies.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
import warnings
from collections.abc import Sequence

HEADER = struct.Struct(">Q")


def die_with_parent() -> None:
    """In a worker child (before exec, or once the zygote forked it): SIGTERM when the launcher
    dies (Linux), so a killed run leaves no workers."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# --- the zygote process ---------------------------------------------------------------------------

def serve(fd: int, preload: list[str], warm: Sequence[str] = ()) -> None:
    """A fresh zygote's life (`python -c "...serve(fd, preload, warm)"`): the imports, then requests."""
    channel = socket.socket(fileno=fd)
    _preload_unless_the_launcher_leaves(channel, preload, warm)
    _fork_on_request(channel)


def _fork_on_request(channel: socket.socket) -> None:
    """The zygote's main loop: fork a worker per request, report its pid and exit code; end with the launcher."""
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([channel], [], [], 0.05)
        if readable:  # a request, or EOF
            request = _receive_or_none(channel)
            if request is None:
                # The launcher is gone. No interpreter shutdown: its collector passes over torch's
                # objects took ~1 s, and a caller reading the launcher's output (a test, a pipe)
                # waited for that, since this process holds the launcher's stdout and stderr.
                os._exit(0)
            spec, out_fd = request
            pid = os.fork()
            if pid == 0:
                channel.close()
                _become_worker(spec, out_fd)  # never returns
            os.close(out_fd)
            children.add(pid)
            _send_line(channel, {"id": spec["id"], "pid": pid})
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                _send_line(channel, {"pid": pid, "code": os.waitstatus_to_exitcode(status)})


def _preload_unless_the_launcher_leaves(channel: socket.socket, preload: list[str], warm: Sequence[str] = ()) -> None:
    """Import `preload` (2-3 s of CPU: torch, torch._dynamo) and trace the `warm` models (the run's
    built-in model: its builder's imports and its trace are what every worker's stage starts with, ~4 s
    of CPU per worker for mobilenetv2 on the 2-core VM of 2026-11-27) while a watcher thread watches the socket: a
    launcher that exits meanwhile (a run refused after it started the zygote early) ends this process at
    once, so it neither keeps a core busy for nothing nor holds the launcher's output open. Returns with
    the imports done and no other thread running, as `fork` needs; a request that arrived is left unread.

    The imports run on this, the main thread, and the watcher touches neither torch nor MKL: importing
    torch makes MKL allocate a buffer it accounts by thread id (`at::init_num_threads` ->
    `mkl_serv_malloc` -> `mm_account_ptr_by_tid`). Done on a thread that then ended, every forked worker
    inherited MKL's record of a dead thread id, and under heavy load workers spun forever in
    `mm_account_ptr_by_tid` while their peers waited in gloo (docs/runtime.md). The main thread's id is
    the zygote's pid, never reused while the zygote lives."""
    imports_done = threading.Event()

    def watch() -> None:
        while not imports_done.is_set():
            readable, _, _ = select.select([channel], [], [], 0.05)
            if readable:
                if _launcher_gone(channel):
                    os._exit(0)
                return  # a request waits: it is served once the imports are done

    watcher = threading.Thread(target=watch, name="launcher-watch", daemon=True)
    watcher.start()
    preload_and_warm(preload, warm)
    imports_done.set()
    watcher.join()


def preload_and_warm(preload: Sequence[str], warm: Sequence[str]) -> None:
    """Import `preload` and trace the `warm` models in this process (on its main thread: see above)."""
    for name in preload:
        with contextlib.suppress(Exception):  # a worker that needs it will report the error itself
            importlib.import_module(name)
    for model in warm:
        with contextlib.suppress(Exception):  # likewise: a model that does not trace fails in the worker
            from hppctl.zoo import trace

            trace(model)


def _launcher_gone(channel: socket.socket) -> bool:
    """Whether the readable socket says EOF (or a reset), without consuming a request's bytes."""
    try:
        return channel.recv(1, socket.MSG_PEEK) == b""
    except ConnectionError:
        return True


def _receive_or_none(channel: socket.socket) -> tuple[dict, int] | None:
    """The next request; None once the launcher is gone. A launcher that exits (on an error, say)
    with our replies still unread makes the kernel reset the socket instead of closing it: that
    ECONNRESET, or a request cut short, is the same end as EOF, not an error worth a traceback."""
    try:
        header, fds, _, _ = socket.recv_fds(channel, HEADER.size, 1)
        if not header:
            return None
        while len(header) < HEADER.size:
            header += _recv_exactly(channel, HEADER.size - len(header))
        body = _recv_exactly(channel, HEADER.unpack(header)[0])
    except (ConnectionError, EOFError):
        return None
    return json.loads(body), fds[0]


def _recv_exactly(channel: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = channel.recv(min(n, 1 << 20))
        if not chunk:
            raise EOFError("the launcher closed the zygote's socket mid-request")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _send_line(channel: socket.socket, doc: dict) -> None:
    with contextlib.suppress(OSError):  # the launcher is gone; the loop ends at the next read
        channel.sendall((json.dumps(doc) + "\n").encode())


def _become_worker(spec: dict, out_fd: int) -> None:
    """In the forked child: what `python -m module` with the payload on stdin would be."""
    code = 1
    try:
        os.setsid()  # like start_new_session: a Ctrl-C at the launcher's terminal is the launcher's to handle
        die_with_parent()
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        os.chdir(spec["cwd"])
        os.environ.clear()
        os.environ.update(spec["env"])
        # what `python -m` would have put on sys.path from this environment (the zygote's started earlier)
        for entry in reversed(spec["env"].get("PYTHONPATH", "").split(os.pathsep)):
            if entry and entry not in sys.path:
                sys.path.insert(1, entry)
        sys.stdin = io.StringIO(spec["payload"] + "\n")
        # The zygote imported the worker module already; running it again as __main__ is the point, so
        # runpy's warning about it would only open every worker's output (and a failure's last lines).
        warnings.filterwarnings("ignore", message=r".*found in sys\.modules after import of package",
                                category=RuntimeWarning)
        runpy.run_module(spec["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # the launcher closed its end: the exit code must still be reported
                stream.flush()
        os._exit(code)


# --- the launcher's side --------------------------------------------------------------------------

class ForkedProcess:
    """A worker forked by the zygote, with the part of `subprocess.Popen` launchers and tests use."""

    def __init__(self, zygote: "Zygote", pid: int) -> None:
        self._zygote, self.pid = zygote, pid

    def poll(self) -> int | None:
        return self._zygote.exit_code(self.pid)

    def wait(self, timeout: float | None = None) -> int:
        code = self._zygote.wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it ended between the poll and the signal
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


IMPORT_TIME_ENV = ("OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH", "PYTORCH", "CUDA", "MALLOC_",
                   "GLIBC_TUNABLES", "LD_", "PYTHONHASHSEED", "PYTHONOPTIMIZE", "PYTHONMALLOC")
"""Environment read when torch and the interpreter start (thread pools, allocators, libraries): a
forked worker inherits what its zygote saw, so workers whose values differ fork from different zygotes."""

SET_BY_TORCH = frozenset({"TORCHINDUCTOR_CACHE_DIR"})
"""Matched by IMPORT_TIME_ENV, but torch writes it into the launcher's own environment (its default,
/tmp/torchinductor_<user>) the first time inductor's cache is asked for, which the launcher's checks may do
after it started the zygote; read at call time, not at import, so it must not ask for a second zygote."""


class Zygote:
    """The launcher's handle on one zygote (one per start-up environment, started on first use)."""

    START_TIMEOUT_S = 120.0

    def __init__(self, preload: list[str], env: dict[str, str], warm: Sequence[str] = (), *,
                 fork_from_here: bool = False) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        forked = ForkedZygote.start(theirs, preload, warm) if fork_from_here and may_fork_from_here(env) else None
        if forked is not None:
            self.proc: "subprocess.Popen | ForkedZygote" = forked
        else:
            code = f"from hppctl.runtime.zygote import serve; serve({theirs.fileno()}, {preload!r}, {list(warm)!r})"
            # No PR_SET_PDEATHSIG here: it fires when the *thread* that started the zygote ends, and a
            # launcher may start its first run from a thread. The zygote ends when its socket reads EOF,
            # which the kernel gives when the launcher process is gone, however it ended.
            self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),), env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self._channel = ours
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._pids: dict[int, int] = {}  # request id -> pid
        self._codes: dict[int, int] = {}  # pid -> exit code
        self._next_id = 0
        self._closed = False
        threading.Thread(target=self._read, daemon=True, name="zygote").start()

    def _read(self) -> None:
        with self._channel.makefile("r", encoding="utf-8") as lines:
            for line in lines:
                doc = json.loads(line)
                with self._cond:
                    if "id" in doc:
                        self._pids[doc["id"]] = doc["pid"]
                    else:
                        self._codes[doc["pid"]] = doc["code"]
                    self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def alive(self) -> bool:
        return self.proc.poll() is None and not self._closed

    def fork(self, module: str, payload: str, env: dict[str, str], cwd: str, out_fd: int) -> ForkedProcess:
        with self._cond:
            request_id, self._next_id = self._next_id, self._next_id + 1
        body = json.dumps({"id": request_id, "module": module, "payload": payload, "env": env, "cwd": cwd}).encode()
        with self._send_lock:
            socket.send_fds(self._channel, [HEADER.pack(len(body))], [out_fd])
            self._channel.sendall(body)
        with self._cond:
            if not self._cond.wait_for(lambda: request_id in self._pids or self._closed, self.START_TIMEOUT_S):
                raise RuntimeError(f"the worker fork server did not start {module} within {self.START_TIMEOUT_S:.0f} s")
            if request_id not in self._pids:
                raise RuntimeError(f"the worker fork server ended (exit {self.proc.poll()}) before starting {module}")
            return ForkedProcess(self, self._pids.pop(request_id))

    def exit_code(self, pid: int) -> int | None:
        with self._cond:
            return self._codes.get(pid, self._lost_code())

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._codes or self._closed, timeout)
            return self._codes.get(pid, self._lost_code())

    def _lost_code(self) -> int | None:
        """A worker's code once the zygote itself is gone: its children got SIGTERM with it."""
        return -15 if self._closed else None


_LAUNCHER_PROCESS = False


def this_process_is_a_launcher() -> None:
    """Said by the CLI's entry point (`python -m hppctl`, the `hppctl` script), never by a library
    caller: the process is one command and nothing else, so its zygote may be a fork of it."""
    global _LAUNCHER_PROCESS
    _LAUNCHER_PROCESS = True


def may_fork_from_here(env: dict[str, str]) -> bool:
    """Whether the zygote for `env` can be a fork of this process rather than a fresh interpreter:
    only in the CLI's own process, on its main thread with no other Python thread (a fork keeps only
    the forking thread, and a lock another thread held would stay held), and for the environment this
    process started torch with (a fork keeps what torch read at its import). The caller vouches for
    the rest (`fork_from_here`): that this process has computed nothing with torch yet, since a fork
    made after torch's OpenMP threads ran hangs in its first parallel region (libgomp; seen here: a
    child of such a parent never finished a 2-thread `relu`)."""
    return (_LAUNCHER_PROCESS and threading.current_thread() is threading.main_thread()
            and threading.active_count() == 1 and startup_env(env) == startup_env(dict(os.environ)))


class ForkedZygote:
    """A zygote forked from the launcher once the launcher has done the zygote's imports itself.

    Why: the launcher imports torch and torch._dynamo and traces the model for its own checks anyway;
    a zygote started as a fresh interpreter did all of it again (~3.6 s of CPU on the 2-core VM of
    2026-11-27, a third of a small run's CPU). Only the commands that start local workers ask for it
    (`hppctl run`, `psl run`, Galaxy's `run`, `hppctl check`'s training step and `hppctl demo`:
    `launch.prepare_local_workers(fork_from_here=True)`), as the first thing they do with torch:
    before the launcher loads data, builds weights or imports a user's module, so the zygote
    holds what a fresh one would: torch's imports, made on the thread whose id stays alive while the
    launcher lives (MKL's thread-id record: see _preload_unless_the_launcher_leaves), and no OpenMP
    threads that ran.

    The child keeps nothing else of the launcher: a session of its own, stdin from /dev/null, every
    descriptor but its socket and stdout/stderr closed (the launcher's end of the socket among them:
    its EOF is how the zygote learns the launcher is gone), and the collector frozen first, so that no
    launcher object it inherited is ever finalized there (one would close a descriptor number the
    zygote has since reused)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    @classmethod
    def start(cls, theirs: socket.socket, preload: Sequence[str], warm: Sequence[str]) -> "ForkedZygote | None":
        """Do the imports here and fork the zygote serving `theirs`; None if the fork fails (no
        memory or process slot for it now: the caller starts a fresh interpreter instead, or fails there)."""
        preload_and_warm(preload, warm)
        try:
            pid = os.fork()
        except OSError:
            return None
        if pid == 0:
            _serve_as_fork(theirs.fileno())
        return cls(pid)

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self) -> int:
        return self._reap(0)

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def _reap(self, flags: int) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, flags)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _serve_as_fork(fd: int) -> None:
    import gc

    gc.freeze()
    try:
        os.setsid()
        # a fresh interpreter's handlers, whatever the launcher set (its workers are forked from here)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.closerange(3, fd)
        os.closerange(fd + 1, max(fd + 1, os.sysconf("SC_OPEN_MAX")))
        _fork_on_request(socket.socket(fileno=fd))  # the imports were made before the fork
    finally:
        os._exit(0)


MAX_ZYGOTES = 4
"""Zygotes a launcher keeps, one per start-up environment; workers of further environments use exec."""

_ZYGOTES: dict[frozenset, Zygote] = {}
_ZYGOTES_LOCK = threading.Lock()


def startup_env(env: dict[str, str]) -> frozenset:
    """The part of an environment that torch and the interpreter read when they start."""
    return frozenset((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME_ENV) and k not in SET_BY_TORCH)


def zygote(preload: list[str], env: dict[str, str], warm: Sequence[str] = (), *,
           fork_from_here: bool = False) -> Zygote | None:
    """The zygote for workers with environment `env`, started (again) if it is not running: one per
    start-up environment (a forked worker keeps what its zygote read when torch started, such as the
    thread count from OMP_NUM_THREADS). None past MAX_ZYGOTES environments: start with exec. `warm`
    counts only when the zygote starts here (a running one keeps what it traced)."""
    key = startup_env(env)
    with _ZYGOTES_LOCK:
        found = _ZYGOTES.get(key)
        if found is None or not found.alive():
            if found is None and len(_ZYGOTES) >= MAX_ZYGOTES:
                return None
            found = _ZYGOTES[key] = Zygote(preload, env, warm, fork_from_here=fork_from_here)
        return found
