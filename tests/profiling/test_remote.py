"""remote.py over fabric's MockRemote (scripted SSH sessions), and the local subprocess endpoint."""

import shlex
import socket
import sys

import paramiko
import pytest
from fabric.testing.base import Command, MockRemote

from hppctl.models.cluster import ClusterSpec
from hppctl.profiling import remote
from hppctl.profiling.remote import DeviceFailure, LineSink, LocalEndpoint, SshEndpoint
from tests.profiling.captured import text


def cluster(tmp_path, **ssh) -> ClusterSpec:
    known = tmp_path / "known_hosts"
    known.write_text("")
    return ClusterSpec.model_validate({
        "name": "c", "devices": [{"name": "pi0", "host": "10.0.0.5", "user": "pi", "python": "/opt/py/bin/python3"}],
        "ssh": {"known_hosts": str(known), "identity_file": "/keys/id", **ssh}})


def endpoint(tmp_path) -> SshEndpoint:
    c = cluster(tmp_path)
    return SshEndpoint(c.devices[0], c)


def probe_cmd(kind, args, python="/opt/py/bin/python3"):
    return shlex.join(remote.probe_command(python, kind, args))


class Remote(MockRemote):
    """fabric's MockRemote, with a safety check that allows the extra connect() arguments hppctl passes
    (key file, look_for_keys, timeout): it checks host and user, and that every scripted command ran."""

    def safety(self):
        for session in self.sessions:
            if session.guard_only:
                continue
            kwargs = session.client.connect.call_args.kwargs
            assert kwargs["hostname"] == (session.host or kwargs["hostname"])
            assert kwargs["username"] == (session.user or kwargs["username"])
            for channel, command in zip(session.channels, session.commands):
                command.expect_execution(channel=channel)


@pytest.fixture
def mock_remote():
    with Remote() as r:
        yield r


def test_version_runs_hppctl_with_the_devices_python(tmp_path, mock_remote):
    mock_remote.expect(host="10.0.0.5", user="pi", cmd="/opt/py/bin/python3 -m hppctl --version", out=b"hppctl 0.1.0\n")
    assert endpoint(tmp_path).version() == "0.1.0"


def test_missing_hppctl_is_no_version(tmp_path, mock_remote):
    mock_remote.expect(cmd="/opt/py/bin/python3 -m hppctl --version", err=b"No module named hppctl\n", exit=1)
    assert endpoint(tmp_path).version() is None


def test_probe_streams_records_as_they_arrive(tmp_path, mock_remote):
    args = {"threads": None}
    mock_remote.expect(cmd=probe_cmd("identify", args), out=text("identify-lab-h3.jsonl").encode())
    seen = []
    records = endpoint(tmp_path).probe("identify", args, on_record=seen.append)
    assert [r["type"] for r in records] == ["identity", "done"] and seen == records
    assert records[0]["hostname"] == "h3"


def test_a_failed_probe_is_a_device_failure_with_the_probes_reason(tmp_path, mock_remote):
    args = {"model": "no-such-model"}
    mock_remote.expect(cmd=probe_cmd("train", args), out=text("train-error.jsonl").encode(), exit=1)
    with pytest.raises(DeviceFailure, match="no-such-model"):
        endpoint(tmp_path).probe("train", args)


def test_a_killed_probe_keeps_its_partial_records(tmp_path, mock_remote):
    args = {"model": "mobilenetv2"}
    mock_remote.expect(cmd=probe_cmd("train", args), out=text("train-killed-lab-h1.jsonl").encode(), exit=-1)
    with pytest.raises(DeviceFailure) as e:
        endpoint(tmp_path).probe("train", args)
    assert "killed at batch 1024" in e.value.reason
    assert [r["type"] for r in e.value.records if r["type"] == "memory"] == ["memory"]


def test_a_probe_without_done_is_a_failure(tmp_path, mock_remote):
    mock_remote.expect(cmd=probe_cmd("identify", {}), out=b'{"type": "identity"}\n')
    with pytest.raises(DeviceFailure, match="exited with 0"):
        endpoint(tmp_path).probe("identify", {})


def test_host_keys_are_checked_against_the_cluster_file(tmp_path, mock_remote):
    mock_remote.expect(cmd="/opt/py/bin/python3 -m hppctl --version", out=b"hppctl 0.1.0\n")
    ep = endpoint(tmp_path)
    ep.version()
    client = ep.conn.client
    client.load_host_keys.assert_called_once_with(str(tmp_path / "known_hosts"))
    [policy] = client.set_missing_host_key_policy.call_args[0]
    assert isinstance(policy, paramiko.RejectPolicy)
    assert client.connect.call_args.kwargs["key_filename"] == ["/keys/id"]  # fabric wraps it in a list


@pytest.mark.parametrize("exc, needle", [
    (paramiko.ssh_exception.NoValidConnectionsError({("10.0.0.5", 22): ConnectionRefusedError()}),
     "unreachable: nothing accepts SSH connections at pi@10.0.0.5:22 (connection refused)"),
    (paramiko.AuthenticationException("no"), "authentication refused at pi@10.0.0.5:22"),
    (paramiko.SSHException("Server '10.0.0.5' not found in known_hosts"), "is not in"),
    (socket.timeout("timed out"), "connecting to pi@10.0.0.5:22 timed out after 10 s"),
    (socket.gaierror("no"), "cannot resolve '10.0.0.5'"),
])
def test_connection_failures_become_one_line_reasons(tmp_path, exc, needle):
    ep = endpoint(tmp_path)

    class Refusing:
        def open(self):
            raise exc

    ep._conn = Refusing()
    with pytest.raises(DeviceFailure) as e:
        ep.open()
    assert needle in e.value.reason


def test_several_commands_on_one_connection(tmp_path):
    with Remote() as r:
        r.expect(commands=[Command('printf %s "$HOME"', out=b"/home/pi"),
                           Command("/opt/py/bin/python3 -m hppctl --version", out=b"hppctl 9.9\n")])
        ep = endpoint(tmp_path)
        assert ep.home() == "/home/pi" and ep.version() == "9.9"


def test_line_sink_splits_chunks_into_records():
    got = []
    sink = LineSink(got.append)
    sink.write('{"type": "a"}\n{"type": ')
    assert got == [{"type": "a"}]
    sink.write('"b"}\nnoise\n{"type": "c"}')
    sink.close()
    assert [r["type"] for r in got] == ["a", "b", "c"] and sink.records == got


def test_local_endpoint_runs_the_probe_in_a_subprocess():
    ep = LocalEndpoint(ClusterSpec.model_validate({"name": "c", "devices": [{"name": "me", "local": True}]}).devices[0])
    assert ep.python == sys.executable
    seen = []
    records = ep.probe("sleep", {"seconds": 0.01}, on_record=seen.append)
    assert [r["type"] for r in records] == ["progress", "slept", "done"] and seen == records
    with pytest.raises(DeviceFailure, match="timed out after 0.5 s") as e:
        ep.probe("sleep", {"seconds": 30}, timeout=0.5)
    assert e.value.records[0]["type"] == "progress"  # what arrived before the timeout is kept
    with pytest.raises(DeviceFailure, match="unknown probe kind 'nope'"):
        ep.probe("nope", {})
    assert ep.version() is not None


def test_local_address_towards_another_local_device_is_loopback():
    c = ClusterSpec.model_validate({"name": "c", "devices": [{"name": "a", "local": True}, {"name": "b", "local": True}]})
    a, b = LocalEndpoint(c.devices[0]), LocalEndpoint(c.devices[1])
    assert a.address_for(b) == "127.0.0.1"
