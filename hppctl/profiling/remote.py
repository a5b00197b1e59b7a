"""Running probes on devices: over SSH with fabric (`host:` devices) or as a subprocess (`local:`).

I/O only. What the probes print is interpreted by parse.py; what to run where is decided by
cluster.py. Both endpoints offer the same calls:

    ep.open()                                  connect (SSH); failures become DeviceFailure with a reason
    ep.version()                               `hppctl --version` on the device, or None if absent
    ep.probe(kind, args, on_record=…)          run a probe to completion, streaming its records
    ep.start_probe(kind, args)                 run one in the background (link servers); .wait()
    ep.address_for(peer)                       the address `peer` reaches this device at
    ep.use_code(code)                          every later probe runs with the user's code (`ProbeCode`)
    ep.close()

Host keys are always checked: the cluster file's `ssh.known_hosts` (else ~/.ssh/known_hosts) is
loaded and unknown keys are refused (paramiko's RejectPolicy), as docs/lab.md explains.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hppctl.errors import RuntimeFailure
from hppctl.models.cluster import ClusterSpec, DeviceSpec
from hppctl.profiling import parse
from hppctl.ssh import connection  # the one place that builds a host-key-checked connection

OnRecord = Callable[[dict[str, Any]], None]
PROBE_MODULE = "hppctl.profiling.probe"


@dataclass(frozen=True)
class ProbeCode:
    """The user's code (`--workdir`) the probes run with, as the layer above hands it down: profiling
    sits below the runtime and never reads or ships a workdir itself.

    `install(conn, python)` makes it present on an SSH device over that device's open fabric
    connection and returns the bytes it sent (0: the device already held it); `remote_path` is
    where it then is (`~` is the device user's home); a `local:` device uses `local_path` as it is.
    Every probe started after `use_code` gets the path with `--path` (probe.py puts it first on
    `sys.path`); the probe that builds the model (cluster.py: train) also imports `modules` first
    (`--import`), so a user module that does not import on a device fails that device, with the
    import error, before anything is measured. The identify and link probes do not import them."""

    local_path: str
    remote_path: str
    install: Callable[[Any, str], int]
    modules: tuple[str, ...] = ()


class DeviceFailure(RuntimeFailure):
    """A device could not be profiled; `reason` is one line for the report."""

    def __init__(self, reason: str, records: Sequence[dict[str, Any]] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.records = list(records)


class LineSink:
    """A write-only text stream that hands every complete JSON line to `on_record` as it arrives."""

    def __init__(self, on_record: OnRecord | None = None) -> None:
        self.on_record = on_record
        self.records: list[dict[str, Any]] = []
        self.text: list[str] = []
        self._partial = ""
        self._lock = threading.Lock()

    def write(self, chunk: str) -> int:
        with self._lock:
            self.text.append(chunk)
            lines = (self._partial + chunk).split("\n")
            self._partial = lines.pop()
            found = parse.records("\n".join(lines))
            self.records.extend(found)
        for record in found:
            if self.on_record is not None:
                self.on_record(record)
        return len(chunk)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self._partial:
            self.write("\n")

    def getvalue(self) -> str:
        return "".join(self.text)


def probe_command(python: str, kind: str, args: dict[str, Any], imports: Sequence[str] = (),
                  path: str | None = None) -> list[str]:
    """The probe's argv; `path`: a directory (the user's `--workdir` on the device) first on its import path."""
    argv = [python, "-m", PROBE_MODULE, kind, "--args", json.dumps(args, separators=(",", ":"))]
    if path is not None:
        argv += ["--path", path]
    for module in imports:
        argv += ["--import", module]
    return argv


class CodeUse:
    """What `use_code` leaves on an endpoint: the user's code path on the device (None: no workdir)."""

    code_path: str | None = None

    def probe_argv(self, python: str, kind: str, args: dict[str, Any], imports: Sequence[str] = ()) -> list[str]:
        return probe_command(python, kind, args, imports, self.code_path)


def _check(kind: str, exit_code: int, stderr: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if exit_code != 0 or parse.error_of(records) or parse.first(records, "done") is None:
        raise DeviceFailure(parse.exit_reason(kind, exit_code, stderr, records), records)
    return records


# ---------------------------------------------------------------------------------------------
# SSH
# ---------------------------------------------------------------------------------------------


def connection_failure(exc: BaseException, device: DeviceSpec, known_hosts: str, timeout_s: float) -> str:
    """One line saying why an SSH connection or command failed."""
    import invoke
    import paramiko

    where = f"{device.user + '@' if device.user else ''}{device.host}:{device.port or 22}"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return f"unreachable: nothing accepts SSH connections at {where} (connection refused)"
    if isinstance(exc, paramiko.BadHostKeyException):
        return f"host key of {device.host} does not match {known_hosts}: refused"
    if isinstance(exc, paramiko.AuthenticationException):
        return f"authentication refused at {where}"
    if isinstance(exc, paramiko.SSHException) and "known_hosts" in str(exc):
        return f"host key of {device.host} is not in {known_hosts}: refused (host-key checking stays on)"
    if isinstance(exc, invoke.CommandTimedOut):
        return f"timed out after {exc.timeout:g} s"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"unreachable: connecting to {where} timed out after {timeout_s:g} s"
    if isinstance(exc, socket.gaierror):
        return f"unreachable: cannot resolve {device.host!r}"
    if isinstance(exc, (OSError, EOFError, paramiko.SSHException)):
        return f"unreachable: {where}: {exc.__class__.__name__}: {exc}"
    return f"{exc.__class__.__name__}: {exc}"


class SshRunning:
    """A probe running in the background over SSH (a link server)."""

    def __init__(self, endpoint: "SshEndpoint", kind: str, promise, sink: LineSink, err: LineSink) -> None:
        self.endpoint, self.kind, self.promise, self.sink, self.err = endpoint, kind, promise, sink, err

    def wait(self) -> list[dict[str, Any]]:
        try:
            result = self.promise.join()
        except Exception as e:  # noqa: BLE001 - fabric raises transport errors from join
            raise DeviceFailure(self.endpoint.failure(e), self.sink.records) from None
        self.sink.close()
        return _check(self.kind, result.exited, self.err.getvalue(), self.sink.records)


class SshEndpoint(CodeUse):
    """A `host:` device reached with fabric."""

    def __init__(self, device: DeviceSpec, cluster: ClusterSpec, connection=None) -> None:
        self.device = device
        self.name = device.name
        self.python = device.python or "python3"
        self.known_hosts = cluster.ssh.known_hosts or os.path.expanduser("~/.ssh/known_hosts")
        self.identity_file = cluster.ssh.identity_file
        self.timeout_s = cluster.ssh.connect_timeout_s
        self._conn = connection

    @property
    def conn(self):
        if self._conn is None:
            self._conn = self._connect()
        return self._conn

    def _connect(self):
        return connection(self.device, self.known_hosts, self.identity_file, self.timeout_s)

    def failure(self, exc: BaseException) -> str:
        return connection_failure(exc, self.device, self.known_hosts, self.timeout_s)

    def open(self) -> None:
        try:
            self.conn.open()
        except Exception as e:  # noqa: BLE001 - every way of failing to connect becomes a reason
            raise DeviceFailure(self.failure(e)) from None

    def run(self, command: str, *, timeout: float | None = None, out: LineSink | None = None,
            err: LineSink | None = None):
        out, err = out or LineSink(), err or LineSink()
        try:
            return self.conn.run(command, hide=False, out_stream=out, err_stream=err, warn=True, in_stream=False,
                                 timeout=timeout)
        except Exception as e:  # noqa: BLE001
            raise DeviceFailure(self.failure(e), out.records) from None

    def version(self) -> str | None:
        result = self.run(f"{shlex.quote(self.python)} -m hppctl --version", timeout=120)
        return parse.parse_version(result.stdout) if result.exited == 0 else None

    def probe(self, kind: str, args: dict[str, Any], *, on_record: OnRecord | None = None,
              timeout: float | None = None, imports: Sequence[str] = ()) -> list[dict[str, Any]]:
        out, err = LineSink(on_record), LineSink()
        command = shlex.join(self.probe_argv(self.python, kind, args, imports))
        result = self.run(command, timeout=timeout, out=out, err=err)
        out.close()
        return _check(kind, result.exited, err.getvalue(), out.records)

    def start_probe(self, kind: str, args: dict[str, Any], *, timeout: float | None = None) -> SshRunning:
        out, err = LineSink(), LineSink()
        command = shlex.join(self.probe_argv(self.python, kind, args))
        try:
            promise = self.conn.run(command, hide=False, out_stream=out, err_stream=err, warn=True, in_stream=False,
                                    timeout=timeout, asynchronous=True)
        except Exception as e:  # noqa: BLE001
            raise DeviceFailure(self.failure(e)) from None
        return SshRunning(self, kind, promise, out, err)

    def use_code(self, code: ProbeCode) -> int:
        """Install the user's code on the device over this connection (after `open`); the bytes sent."""
        from hppctl.ssh import InstallFailed

        try:
            sent = code.install(self.conn, self.python)
        except InstallFailed as e:  # a remote step's own line (full disk, no sftp subsystem)
            raise DeviceFailure(f"could not install --workdir in {code.remote_path}: {e}") from None
        except Exception as e:  # noqa: BLE001 - the connection's failures become its reason
            raise DeviceFailure(f"could not install --workdir in {code.remote_path}: {self.failure(e)}") from None
        self.code_path = code.remote_path
        return sent

    def address_for(self, peer) -> str:
        """The device's address as this machine resolves it (peers use the same network)."""
        host = getattr(self.conn, "host", None) or self.device.host
        try:
            return socket.gethostbyname(host)
        except OSError:
            return host

    def host_key(self) -> str | None:
        """SHA-256 of the SSH host key the device presented (after `open`)."""
        import hashlib

        transport = self.conn.client.get_transport()
        key = transport.get_remote_server_key() if transport is not None else None
        return hashlib.sha256(key.asbytes()).hexdigest()[:16] if key is not None else None

    def home(self) -> str:
        result = self.run('printf %s "$HOME"', timeout=60)
        if result.exited != 0 or not result.stdout.strip():
            raise DeviceFailure("cannot read $HOME on the device")
        return result.stdout.strip()

    def put(self, local: str, remote: str) -> None:
        try:
            self.conn.put(local, remote)
        except Exception as e:  # noqa: BLE001
            raise DeviceFailure(f"copying {os.path.basename(local)} to the device failed: {self.failure(e)}") from None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


# ---------------------------------------------------------------------------------------------
# local subprocess
# ---------------------------------------------------------------------------------------------


class LocalRunning:
    def __init__(self, kind: str, process: subprocess.Popen, sink: LineSink, timeout: float | None) -> None:
        self.kind, self.process, self.sink, self.timeout = kind, process, sink, timeout
        self._stderr: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._err_reader = threading.Thread(target=lambda: self._stderr.append(process.stderr.read()), daemon=True)
        self._reader.start()
        self._err_reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.sink.write(line)

    def wait(self) -> list[dict[str, Any]]:
        try:
            code = self.process.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise DeviceFailure(f"timed out after {self.timeout:g} s", self.sink.records) from None
        self._reader.join()
        self._err_reader.join()
        self.sink.close()
        return _check(self.kind, code, "".join(self._stderr), self.sink.records)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()


class LocalEndpoint(CodeUse):
    """A `local:` device: probes run as subprocesses of this interpreter."""

    def __init__(self, device: DeviceSpec, python: str | None = None) -> None:
        self.device = device
        self.name = device.name
        self.python = python or device.python or sys.executable
        self._running: list[LocalRunning] = []

    def open(self) -> None:
        pass

    def host_key(self) -> str | None:
        return None

    def version(self) -> str | None:
        result = subprocess.run([self.python, "-m", "hppctl", "--version"], capture_output=True, text=True,
                                timeout=120)
        return parse.parse_version(result.stdout) if result.returncode == 0 else None

    def start_probe(self, kind: str, args: dict[str, Any], *, timeout: float | None = None,
                    on_record: OnRecord | None = None, imports: Sequence[str] = ()) -> LocalRunning:
        process = subprocess.Popen(self.probe_argv(self.python, kind, args, imports), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, bufsize=1)
        running = LocalRunning(kind, process, LineSink(on_record), timeout)
        self._running.append(running)
        return running

    def probe(self, kind: str, args: dict[str, Any], *, on_record: OnRecord | None = None,
              timeout: float | None = None, imports: Sequence[str] = ()) -> list[dict[str, Any]]:
        return self.start_probe(kind, args, timeout=timeout, on_record=on_record, imports=imports).wait()

    def use_code(self, code: ProbeCode) -> None:
        """This machine's devices use the workdir where it is: nothing is sent (None)."""
        self.code_path = code.local_path
        return None

    def address_for(self, peer) -> str:
        """Loopback for another local device; else the source address this machine uses towards the peer."""
        if isinstance(peer, LocalEndpoint):
            return "127.0.0.1"
        target = peer.address_for(self)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))  # UDP connect sends nothing; it only picks the route
            return s.getsockname()[0]

    def close(self) -> None:
        for running in self._running:
            running.kill()


def endpoint_for(device: DeviceSpec, cluster: ClusterSpec):
    """The endpoint of a measured device (`host:` or `local:`)."""
    if device.host is not None:
        return SshEndpoint(device, cluster)
    if device.local:
        return LocalEndpoint(device)
    raise ValueError(f"device {device.name!r} is a preset: nothing to connect to")
