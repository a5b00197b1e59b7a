"""Starting workers over SSH, and the zygote's end (issue 23, item 10): a device that cannot be
reached is one line naming it and why, through the real `hppctl run` (exit 1 when unreachable,
exit 2 when the cluster file is wrong); the remote command line is shell-quoted; the zygote ends
quietly when the launcher goes away with replies unread. Quoting and host keys against a real
sshd: tests/runtime/test_lab_run.py."""

from __future__ import annotations

import json
import os
import select
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hppctl.models.cluster import ClusterSpec
from hppctl.runtime.launch import remote_command
from hppctl.store import save
from tests.runtime.factories import local_cluster, make_plan

REPO = str(Path(__file__).resolve().parents[2])


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released: a connection is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_with_ssh_device(tmp_path: Path, host: str, port: int | None) -> subprocess.CompletedProcess:
    """`hppctl run` (a real process) on devices a, b (local) and c (SSH to `host`)."""
    plan = make_plan("tiny-mlp", [((0, 2), ["a", "b"], [3, 1]), ((2, 5), ["c"], [4])], global_batch=16, micro_batch=4)
    doc = local_cluster("a", "b", "c").model_dump(mode="json")
    doc["devices"][2] = {"name": "c", "host": host, "port": port, "user": "root"}
    doc["ssh"] = {"known_hosts": str(tmp_path / "known_hosts"), "connect_timeout_s": 2}
    (tmp_path / "known_hosts").write_text("")
    save(tmp_path / "plan.yaml", plan)
    save(tmp_path / "cluster.yaml", ClusterSpec.model_validate(doc))
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.run([sys.executable, "-m", "hppctl", "run", "--plan", str(tmp_path / "plan.yaml"),
                           "--cluster", str(tmp_path / "cluster.yaml"), "--rounds", "2", "--dataset", "digits"],
                          capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("host, reasons", [
    ("127.0.0.1", ("connection refused",)),  # a closed port: nothing listens
    ("192.0.2.1", ("timed out", "unreachable")),  # TEST-NET-1 (RFC 5737): nobody answers, or no route
])
def test_an_unreachable_ssh_device_is_one_line_naming_it(tmp_path, host, reasons):
    """exit 1, one line with the device, address and reason, and no traceback from the launcher
    nor from the zygote its local workers were forked from."""
    port = _closed_port()
    result = _run_with_ssh_device(tmp_path, host, port)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "ConnectionResetError" not in result.stderr, result.stderr
    [line] = _error_lines(result.stderr)
    assert "'c'" in line and f"{host}:{port}" in line and any(reason in line for reason in reasons), line


@pytest.mark.timeout(300)
def test_an_ssh_host_that_does_not_resolve_is_bad_input(tmp_path):
    """A `host:` that is no name at all (.invalid never resolves, RFC 2606): the cluster file is wrong, exit 2."""
    result = _run_with_ssh_device(tmp_path, "no-such-host.invalid", None)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    [line] = _error_lines(result.stderr)
    assert "no-such-host.invalid" in line and "does not resolve" in line


@pytest.mark.parametrize("python", ["/opt/my python/bin/python3", "python3;touch /tmp/x", "$(reboot)", "~/py"])
def test_the_remote_command_line_is_one_word_per_argument(python):
    env = {"PYTHONPATH": "/a b;c", "OMP_NUM_THREADS": "2"}
    words = shlex.split(remote_command(python, "hppctl.runtime.worker", env))
    assert words == ["env", "PYTHONPATH=/a b;c", "OMP_NUM_THREADS=2", python, "-m", "hppctl.runtime.worker"]
    assert shlex.split(remote_command(python, "m", {})) == [python, "-m", "m"]


def test_the_zygote_ends_quietly_when_the_launcher_leaves_replies_unread(tmp_path):
    """The launcher closes its end with the zygote's reply still unread (it exited on an error):
    the zygote's next read is ECONNRESET, which used to print a ConnectionResetError traceback."""
    from hppctl.runtime.zygote import HEADER

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    code = f"from hppctl.runtime.zygote import serve; serve({theirs.fileno()}, [])"
    env = {**os.environ, "PYTHONPATH": REPO}
    zygote = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),), env=env,
                              stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    theirs.close()
    read_fd, write_fd = os.pipe()
    body = json.dumps({"id": 0, "module": "tests.runtime.echo_worker", "payload": json.dumps({"exit": 0}),
                       "env": env, "cwd": REPO}).encode()
    socket.send_fds(ours, [HEADER.pack(len(body))], [write_fd])
    ours.sendall(body)
    os.close(write_fd)
    assert select.select([ours], [], [], 60)[0], "the zygote did not answer"  # its reply waits, unread
    ours.close()
    _, err = zygote.communicate(timeout=60)
    os.close(read_fd)
    assert zygote.returncode == 0 and "Traceback" not in err, err
