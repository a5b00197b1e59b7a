"""The lab's recv and echo servers against other users of the machine, on real loopback sockets (no
lab needed): 127.0.0.2 plays another address. No wall-clock assertions."""

from __future__ import annotations

import json
import threading
import time

from hppctl.lab import probe
from tests.hostile_peers import connect_from, free_port, ping_until_closed


def in_thread(fn, *args):
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    thread.start()
    return out, thread


def test_recv_refuses_a_stranger_that_connects_first_and_measures_the_sender(capsys):
    port = free_port()
    out, thread = in_thread(probe.main, ["recv", "--bind", "127.0.0.1", "--peer", "127.0.0.1", "--port", str(port),
                                         "--timeout", "5"])
    with connect_from("127.0.0.2", port) as stranger:
        stranger.sendall(b"x" * 1000)
        time.sleep(0.2)
        sent = probe.send("127.0.0.1", port, 0.2)
    thread.join(20)
    assert out == [0]
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["bytes"] == sent["bytes"] > 0 and result["refused"] == 1 and result["bytes_per_s"] > 0


def test_echo_answers_the_pings_it_was_told_of_and_no_more():
    port = free_port()
    out, thread = in_thread(probe.echo, "127.0.0.1", "127.0.0.1", port, 3, 5.0)
    with connect_from("127.0.0.1", port) as conn:
        answered = ping_until_closed(conn)
    thread.join(20)
    assert out[0]["echoed"] == 4 and out[0]["refused"] == 0 and answered == 4


def test_a_server_that_sees_only_strangers_prints_one_error_line(capsys):
    port = free_port()
    out, thread = in_thread(probe.main, ["recv", "--bind", "127.0.0.1", "--peer", "127.0.0.9", "--port", str(port),
                                         "--timeout", "1"])
    with connect_from("127.0.0.1", port) as s:
        s.sendall(b"x")
    thread.join(20)
    lines = capsys.readouterr().out.strip().splitlines()
    assert out == [1] and len(lines) == 1
    error = json.loads(lines[0])["error"]
    assert "127.0.0.9" in error and "refused 1" in error and "127.0.0.1" in error
