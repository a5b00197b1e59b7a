"""Starting worker processes: local subprocesses, or over SSH with fabric (host-key checking on).

A launched worker is a `WorkerProcess`: `poll()` gives its exit code once it ended, `tail()` its
last output lines, `stop()` ends it. Each worker reads one JSON line on its standard input
(`{"token", "config"}`), so the token never appears on a command line.

A local worker is forked by the launcher's zygote (`runtime/zygote.py`), a process that imported
torch and the worker modules once: started as `python -m`, each worker spent 4-6 s of CPU on those
imports. It is still its own process (own pid and session, the module run as `__main__`).
`HPPCTL_LOCAL_START=exec` starts each worker as a fresh `python -m` process instead.

Over SSH the command is `<python> -m hppctl.runtime.worker` with the device's `python:` (default
`python3`), every word shell-quoted (`remote_command`); hppctl must be installed there. A device
that cannot be reached is one line naming it and why (`ssh_start_failure`), exit 2 when the
cluster file is wrong (name, host key, login), exit 1 when the host is down or unreachable. On the edge lab every SSH session already runs in the
host's network namespace and cgroup, so the worker gets the host's CPU quota, memory limit and
links.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable
from typing import Protocol

from hppctl.errors import BadInput, HppctlError, RuntimeFailure, first_line
from hppctl.models.cluster import ClusterSpec, DeviceSpec
from hppctl.runtime.zygote import die_with_parent, zygote
from hppctl.ssh import connect

TAIL_LINES = 40
WORKER_MODULE = "hppctl.runtime.worker"
LOCAL_START_ENV = "HPPCTL_LOCAL_START"
PRELOAD = ["torch", "torch._dynamo", "hppctl.cli", "hppctl.runtime.worker", "hppctl.runtime.ft_worker",
           "hppctl.runtime.psl.worker", "hppctl.runtime.galaxy.worker", "hppctl.zoo.layers"]
"""What the zygote imports before it forks any worker (a module that fails to import is skipped)."""


class WorkerProcess(Protocol):
    device: str

    def poll(self) -> int | None: ...
    def tail(self) -> list[str]: ...
    def stop(self) -> None: ...


class _Tail:
    """A file-like sink keeping the last lines (and optionally echoing them to a log file)."""

    def __init__(self, device: str, log=None) -> None:
        self.device, self.log = device, log
        self.lines: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._partial = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            text = self._partial + text
            *complete, self._partial = text.split("\n")
            self.lines.extend(complete)
            if self.log is not None:
                self.log.write("".join(f"[{self.device}] {line}\n" for line in complete))
                self.log.flush()
        return len(text)

    def flush(self) -> None:
        pass

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self.lines) + ([self._partial] if self._partial else [])


def default_threads(cluster: ClusterSpec, devices: list[str]) -> int:
    """torch threads per worker when none are asked for: the machine's cores shared by the local
    workers when every device is local; 0 (each worker follows its OMP_NUM_THREADS) otherwise."""
    local = [d for d in devices if cluster.device(d).local]
    if local and len(local) == len(devices):
        return max(1, (os.cpu_count() or 1) // len(local))
    return 0


def prepare_local_workers(cluster: ClusterSpec, devices: Iterable[str], env: dict[str, str] | None = None, *,
                          model: str | None = None, fork_from_here: bool = False) -> None:
    """Start the zygote now if any of `devices` is local, so that its imports overlap the
    launcher's own preparation (the initial weights) instead of following it; with the run's
    `model`, the zygote also traces it (`models_to_warm`) for every worker it forks.
    `fork_from_here`: the caller is a run command that has computed nothing with torch yet, so in the
    CLI's process the zygote may be a fork of it (`zygote.ForkedZygote`: the imports made once)."""
    if _local_start() == "fork" and any(cluster.device(d).host is None for d in devices):
        zygote(PRELOAD, _worker_env(env), models_to_warm(model), fork_from_here=fork_from_here)


def models_to_warm(model: str | None) -> list[str]:
    """The models a zygote traces before it forks: the run's, if built in. A user's model
    (`package.module:factory`) is imported by each worker itself, with its workdir on the path and
    the code as it is when the worker starts: a zygote kept by the process would hold an old copy."""
    from hppctl.zoo.user import is_user_ref

    return [] if model is None or is_user_ref(model) else [model]


def _worker_env(extra: dict[str, str] | None) -> dict[str, str]:
    """A local worker's environment: the launcher's, with the run's additions."""
    return {**os.environ, **(extra or {})}


def _local_start() -> str:
    start = os.environ.get(LOCAL_START_ENV, "fork")
    if start not in ("fork", "exec"):
        raise BadInput(f"{LOCAL_START_ENV}={start!r}: expected fork or exec")
    return start


def _fork_worker(module: str, payload: str, env: dict[str, str], out_fd: int):
    """Fork the worker, its output to `out_fd`, from the zygote of its start-up environment
    (`zygote.zygote`), or start it with exec past the zygotes a launcher keeps."""
    server = zygote(PRELOAD, env)
    if server is None:
        return _exec_worker(module, payload, env, out_fd)
    return server.fork(module, payload, env, os.getcwd(), out_fd)


def _exec_worker(module: str, payload: str, env: dict[str, str], out_fd: int) -> subprocess.Popen:
    """Start the worker as a fresh `python -m` process, its output to `out_fd`."""
    proc = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=out_fd,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=die_with_parent)
    proc.stdin.write((payload + "\n").encode())
    proc.stdin.close()
    return proc


class LocalWorker:
    def __init__(self, device: str, payload: str, *, env: dict[str, str] | None = None, log=None,
                 module: str = WORKER_MODULE) -> None:
        self.device = device
        self._tail = _Tail(device, log)
        start = _fork_worker if _local_start() == "fork" else _exec_worker
        read_fd, write_fd = os.pipe()
        try:
            self.proc = start(module, payload, _worker_env(env), write_fd)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)  # the worker holds its own copy: EOF on read_fd means it is gone
        self._output = open(read_fd, encoding="utf-8", errors="replace")
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"tail-{device}")
        self._reader.start()

    def _read(self) -> None:
        with self._output:
            for line in self._output:
                self._tail.write(line)

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None:
            self._reader.join(timeout=2)
        return code

    def tail(self) -> list[str]:
        return self._tail.snapshot()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _term_then_kill(pid: int, grace_s: float = 2.0) -> str:
    """POSIX sh: SIGTERM, then SIGKILL if the process outlives `grace_s`. It returns as soon as the
    process is gone: a worker that has just finished its run is usually exiting already, and a fixed
    `sleep 2` here cost each SSH worker 2 s at the end of every run."""
    ticks = max(1, round(grace_s / 0.1))
    return (f"kill -TERM {pid} 2>/dev/null || exit 0; i=0; while [ $i -lt {ticks} ]; do "
            f"kill -0 {pid} 2>/dev/null || exit 0; sleep 0.1; i=$((i+1)); done; kill -KILL {pid} 2>/dev/null; true")


def stop_workers(workers: Iterable[WorkerProcess]) -> None:
    """Stop every worker at once (each may wait for a grace period); best effort, with a warning
    for a worker that could not be stopped: the run's own outcome matters more."""
    def stop(worker: WorkerProcess) -> None:
        try:
            worker.stop()
        except Exception as e:  # torch's errors carry their C++ trace after the first line
            print(f"warning: could not stop worker {worker.device}: {first_line(e)}", file=sys.stderr)

    threads = [threading.Thread(target=stop, args=(w,), daemon=True) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


class _WholeReads(io.StringIO):
    """A worker's stdin payload for fabric. invoke copies a non-terminal `in_stream` to the remote
    side one `read(1)` at a time with a 10 ms nap between reads (`Runner.input_sleep`), so a 3 KB
    config took 30 s to reach each SSH worker; every read here returns all that is left."""

    def read(self, size: int | None = -1) -> str:
        return super().read()


def payload_stream(payload: str) -> io.StringIO:
    """The stdin fabric copies to an SSH worker: the payload line, handed over in one read."""
    return _WholeReads(payload + "\n")


def remote_command(python: str, module: str, env: dict[str, str]) -> str:
    """The shell command line an SSH worker is started with: `[env K=V ...] <python> -m <module>`,
    every word shell-quoted (sshd hands the line to the login shell). A device's `python:` is one
    path, never shell text: a path with a space or `;` must start that interpreter, nothing else."""
    words = (["env", *(f"{k}={v}" for k, v in env.items())] if env else []) + [python, "-m", module]
    return shlex.join(words)


def ssh_start_failure(exc: BaseException, device: DeviceSpec, cluster: ClusterSpec) -> HppctlError:
    """One line naming the device, its address and why SSH could not start its worker.

    Exit 2 (BadInput) where the cluster file must change: a host name that does not resolve, a
    host key missing from or different in `ssh.known_hosts`, a refused login or a missing
    `ssh.identity_file`. Exit 1 (RuntimeFailure) where the same file may work later: connection
    refused, timed out, no route, the connection dropped."""
    import paramiko

    where = f"device {device.name!r} ({device.user + '@' if device.user else ''}{device.host}:{device.port or 22})"
    known_hosts = cluster.ssh.known_hosts or "~/.ssh/known_hosts"
    if isinstance(exc, socket.gaierror):
        return BadInput(f"{where}: host {device.host!r} does not resolve ({exc.strerror}): check its `host:`")
    if isinstance(exc, paramiko.BadHostKeyException):
        return BadInput(f"{where}: its host key differs from the one in {known_hosts} (ssh.known_hosts): refused")
    if isinstance(exc, paramiko.SSHException) and "known_hosts" in str(exc):
        return BadInput(f"{where}: its host key is not in {known_hosts} (ssh.known_hosts): refused, "
                        f"host-key checking stays on")
    if isinstance(exc, paramiko.AuthenticationException):
        return BadInput(f"{where}: login refused: no key accepted "
                        f"(ssh.identity_file: {cluster.ssh.identity_file or 'none, default keys'})")
    if isinstance(exc, FileNotFoundError):
        return BadInput(f"{where}: ssh.identity_file {cluster.ssh.identity_file!r} not found")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return RuntimeFailure(f"{where}: unreachable: connection refused (is sshd running there?)")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return RuntimeFailure(f"{where}: unreachable: connecting timed out after {cluster.ssh.connect_timeout_s:g} s")
    if isinstance(exc, OSError) and exc.strerror:
        return RuntimeFailure(f"{where}: unreachable: {exc.strerror}")
    reason = " ".join(str(exc).split()) or exc.__class__.__name__
    return RuntimeFailure(f"{where}: SSH failed: {reason[:200]}")


class SshWorker:
    """A worker started with fabric on an SSH device. `pid_of()` (from the run's store) lets `stop`
    signal the remote process over a second connection."""

    def __init__(self, device: DeviceSpec, cluster: ClusterSpec, payload: str, *, pid_of=None, log=None,
                 env: dict[str, str] | None = None, module: str = WORKER_MODULE, workdir=None) -> None:
        """`workdir`: a `runtime.workdir.Workdir` to install on the device (over this connection,
        before the worker starts); `workdir_sent` is then the bytes that took (0: the device had it)."""
        self.device, self.spec, self.cluster, self._pid_of = device.name, device, cluster, pid_of
        self._tail = _Tail(device.name, log)
        self.conn = connect(cluster, device.name)
        self.workdir_sent: int | None = None
        command = remote_command(device.python or "python3", module, env or {})
        try:
            self.conn.open()  # now, so that a failure to connect is told apart from the worker's own
            if workdir is not None:
                self.workdir_sent = self._install(workdir)
            self.promise = self.conn.run(command, in_stream=payload_stream(payload), asynchronous=True,
                                         hide=False, warn=True, out_stream=self._tail, err_stream=self._tail,
                                         pty=False)
        except HppctlError:  # the workdir's install said what failed
            self.conn.close()
            raise
        except Exception as e:  # noqa: BLE001 - paramiko and fabric fail in many classes; each becomes one line
            self.conn.close()
            raise ssh_start_failure(e, device, cluster) from None
        self._code: int | None = None

    def _install(self, workdir) -> int:
        """Install `workdir` in the device's cache (runtime/workdir.py); a remote step that fails
        (a full disk, no `python:`) is this device's failure, one line."""
        from hppctl.runtime.workdir import install
        from hppctl.ssh import InstallFailed

        try:
            return install(self.conn, workdir, self.spec.python or "python3")
        except InstallFailed as e:
            raise RuntimeFailure(f"device {self.device!r}: could not install --workdir {workdir.digest[:12]} in "
                                 f"{workdir.remote_path}: {e}") from None

    def poll(self) -> int | None:
        if self._code is None and self.promise.runner.process_is_finished:
            try:
                result = self.promise.join()
                self._code = result.exited if result.exited is not None else 255
            except Exception as e:  # the connection dropped
                self._tail.write(f"ssh: {e}\n")
                self._code = 255
        return self._code

    def tail(self) -> list[str]:
        return self._tail.snapshot()

    def stop(self) -> None:
        if self.poll() is not None:
            return
        try:  # the pid comes from the run's store, which may be what failed (runtime/address_watch.py)
            pid = self._pid_of(self.device) if self._pid_of else None
            if pid:
                with contextlib.suppress(Exception), connect(self.cluster, self.device) as c:
                    c.run(_term_then_kill(int(pid)), hide=True, warn=True, in_stream=False)
        finally:
            with contextlib.suppress(Exception):
                self.conn.close()
