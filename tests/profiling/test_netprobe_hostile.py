"""The link server against hostile peers, on real loopback sockets (issue 23: every byte from the
network is hostile). 127.0.0.2 plays "another machine": all of 127/8 is loopback on Linux, and a
client socket bound there connects from that address. No wall-clock assertions: deadlines are
short so the tests are quick, but only what happened is checked, never how long it took."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from hppctl.profiling import netprobe, parse
from hppctl.profiling.remote import DeviceFailure, LocalEndpoint
from hppctl.models.cluster import ClusterSpec
from tests.hostile_peers import connect_from, free_port, ping_until_closed

TOKEN = "0123456789abcdef0123456789abcdef"


def serve(**args):
    """Start link_serve in a thread: (records, errors, thread) once it listens."""
    server = netprobe.link_serve({"bind": "127.0.0.1", "peer": "127.0.0.1", "token": TOKEN, "seconds": 0.2,
                                  "timeout_s": 5, "count": 5, **args})
    assert next(server)["type"] == "listening"
    served: list[dict] = []
    errors: list[BaseException] = []

    def drain():
        try:
            served.extend(server)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            errors.append(e)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    return served, errors, thread


def test_a_stranger_connecting_first_is_refused_and_the_prober_measures():
    port = free_port()
    served, errors, thread = serve(port=port)
    with connect_from("127.0.0.2", port) as stranger:  # first in the queue, from another address
        stranger.sendall(TOKEN.encode() + b"x" * 1000)  # even knowing the token
        time.sleep(0.2)  # let the server see it before the prober connects
        tested = list(netprobe.link_test({"to": "127.0.0.1", "port": port, "token": TOKEN, "seconds": 0.2,
                                          "count": 5, "timeout_s": 5}))
    thread.join(20)
    assert not thread.is_alive() and not errors, errors
    assert [r["type"] for r in served] == ["recv", "send", "echo"]
    assert served[0]["bytes"] == tested[0]["bytes"] > 0 and tested[1]["bytes"] == served[1]["bytes"] > 0
    assert served[0]["refused"] == 1 and len(tested[2]["rtt_s"]) == 5
    assert parse.received(served).refused == 1  # the record still reads as a measurement


def test_a_stranger_from_the_probers_address_without_the_token_is_refused():
    port = free_port()
    served, errors, thread = serve(port=port)
    with connect_from("127.0.0.1", port) as stranger:
        stranger.sendall(b"\xff" * 64)  # not the token: refused, and its bytes are not counted
        time.sleep(0.2)
        tested = list(netprobe.link_test({"to": "127.0.0.1", "port": port, "token": TOKEN, "seconds": 0.2,
                                          "count": 5, "timeout_s": 5}))
    thread.join(20)
    assert not thread.is_alive() and not errors, errors
    assert served[0]["bytes"] == tested[0]["bytes"] and served[0]["refused"] == 1


def spy_readings():
    """A Readings class that remembers the most readings any instance ever held."""

    class SpyReadings(netprobe.Readings):
        most = 0

        def add(self, t: float, total: int) -> None:
            super().add(t, total)
            SpyReadings.most = max(SpyReadings.most, len(self.points()))

    return SpyReadings


def stream_until(stop: threading.Event, conn: socket.socket) -> None:
    payload = b"z" * (1 << 16)
    try:
        while not stop.is_set():
            conn.sendall(payload)
    except OSError:
        pass  # the server closed: what the fix does


def test_a_prober_streaming_past_the_deadline_ends_the_step_with_bounded_readings(monkeypatch):
    spy = spy_readings()
    monkeypatch.setattr(netprobe, "Readings", spy)
    monkeypatch.setattr(netprobe, "MAX_READINGS", 64)
    port = free_port()
    served, errors, thread = serve(port=port, seconds=0.1, timeout_s=2)  # room for a loaded machine
    stop = threading.Event()
    conn = connect_from("127.0.0.1", port)
    conn.sendall(TOKEN.encode())
    streamer = threading.Thread(target=stream_until, args=(stop, conn), daemon=True)
    streamer.start()
    thread.join(20)
    ended = not thread.is_alive()
    stop.set()
    streamer.join(10)
    conn.close()
    assert ended, "the step never ended while the peer kept sending"
    assert not served and len(errors) == 1 and isinstance(errors[0], netprobe.LinkFailure)
    assert "still sending" in str(errors[0]) and "\n" not in str(errors[0])
    assert 0 < spy.most <= 65  # the kept readings plus the latest one


@pytest.mark.parametrize("pause_s, said", [(0.3, "still sending"), (None, "went silent")])
def test_a_sender_at_the_deadline_is_called_silent_only_when_it_was(pause_s, said):
    """A sender that sends a burst every 0.3 s past the deadline was called silent: the receive that
    spans the deadline (its timeout is the time left) always waits between two bursts. Seen under
    load in the suite with the continuous streamer above, whose thread the machine had paused.
    One that sends once and then nothing is silent."""
    port = free_port()
    served, errors, thread = serve(port=port, seconds=0.1, timeout_s=1)
    conn = connect_from("127.0.0.1", port)
    conn.sendall(TOKEN.encode())
    stop = threading.Event()

    def bursts():
        try:
            while not stop.is_set():
                conn.sendall(b"z" * 1000)
                if pause_s is None:
                    return
                time.sleep(pause_s)
        except OSError:
            pass  # the server closed at its deadline

    sender = threading.Thread(target=bursts, daemon=True)
    sender.start()
    thread.join(20)
    stop.set()
    sender.join(10)
    conn.close()
    assert not thread.is_alive() and not served and len(errors) == 1, errors
    assert said in str(errors[0]), errors[0]


def test_echo_ends_after_the_round_trips_it_was_told_of():
    port = free_port()
    served, errors, thread = serve(port=port, count=5)
    with netprobe_connect(port) as conn:  # the two transfers, as the prober makes them
        conn.sendall(b"z" * 1000)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)
    with netprobe_connect(port) as conn:
        while conn.recv(1 << 16):
            pass
    with netprobe_connect(port) as conn:
        answered = ping_until_closed(conn)
    thread.join(20)
    assert not thread.is_alive() and not errors, errors
    assert served[2]["echoed"] == answered == 6  # count + the warm-up, then the server closes


def netprobe_connect(port: int) -> socket.socket:
    conn = connect_from("127.0.0.1", port)
    conn.sendall(TOKEN.encode())
    return conn


def test_readings_stay_bounded_and_keep_the_goodput():
    from tests.profiling.test_netprobe import RATE, throttled_readings

    readings = netprobe.Readings(limit=64)
    for t, total in throttled_readings():
        readings.add(t, total)
    kept = readings.points()
    assert len(kept) <= 65 and kept[-1] == throttled_readings()[-1] and kept[0] == throttled_readings()[0]
    assert netprobe.steady_rate(kept) == pytest.approx(RATE, rel=0.015)
    many = netprobe.Readings(limit=64)
    for i in range(200_000):
        many.add(i * 1e-4, i * 1000)
    assert len(many.points()) <= 65 and netprobe.steady_rate(many.points()) == pytest.approx(1e7)


def local_endpoint() -> LocalEndpoint:
    return LocalEndpoint(ClusterSpec.model_validate({"name": "c", "devices": [{"name": "me", "local": True}]}).devices[0])


def test_a_server_that_only_saw_strangers_fails_in_one_line_naming_them():
    port = free_port()
    running = local_endpoint().start_probe("link-serve", {"bind": "127.0.0.1", "port": port, "peer": "127.0.0.9",
                                                          "token": TOKEN, "seconds": 0.2, "timeout_s": 1.5},
                                           timeout=30)
    for _ in range(3):  # the prober's own address is 127.0.0.1 here: not the one the server expects
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(TOKEN.encode())
                s.recv(1)
        except ConnectionRefusedError:
            time.sleep(0.2)  # not listening yet
        except OSError:
            pass
    with pytest.raises(DeviceFailure) as e:
        running.wait()
    reason = e.value.reason
    assert "\n" not in reason and "Traceback" not in reason
    assert "127.0.0.9" in reason and "refused" in reason and "127.0.0.1" in reason


def test_measure_link_between_two_local_devices_passes_the_peer_and_a_fresh_token():
    from hppctl.profiling.cluster import ProbeSettings
    from hppctl.profiling.links import measure_link

    c = ClusterSpec.model_validate({"name": "c", "devices": [{"name": "a", "local": True}, {"name": "b", "local": True}]})
    a, b = LocalEndpoint(c.devices[0]), LocalEndpoint(c.devices[1])
    calls = []
    start = LocalEndpoint.start_probe

    def spy(self, kind, args, **kw):
        calls.append(args)
        return start(self, kind, args, **kw)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(LocalEndpoint, "start_probe", spy)
        link = measure_link(a, b, ProbeSettings(link_seconds=0.2, ping_count=3))
        measure_link(a, b, ProbeSettings(link_seconds=0.2, ping_count=3))
    assert link.source == "measured" and min(link.directed_bytes_per_s) > 0
    serve_args = [args for args in calls if "bind" in args]
    assert serve_args[0]["peer"] == "127.0.0.1" and len(bytes.fromhex(serve_args[0]["token"])) >= 16
    assert serve_args[0]["token"] != serve_args[1]["token"]  # a fresh token per measurement


def test_a_prober_the_server_refuses_says_so_in_one_line():
    port = free_port()
    served, errors, thread = serve(port=port, peer="127.0.0.9", timeout_s=1.5)  # expects another prober
    with pytest.raises(netprobe.LinkFailure, match="closed the connection") as e:
        list(netprobe.link_test({"to": "127.0.0.1", "port": port, "token": TOKEN, "seconds": 0.5, "count": 5,
                                 "timeout_s": 5}))
    thread.join(20)
    assert "\n" not in str(e.value) and not served and "refused" in str(errors[0])
