"""Heartbeats and probes carry the run's token; the coordinator drops anything else (no processes)."""

from __future__ import annotations

import socket
import time

from hppctl.runtime.heartbeat import HeartbeatListener, HeartbeatSender, ProbeResponder, probe, sign


def listener(**kw) -> HeartbeatListener:
    return HeartbeatListener("127.0.0.1", "the-token", {"a": {"127.0.0.1"}}, **kw).start()


def send_from(address: str, port: int, data: bytes) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((address, 0))
        s.sendto(data, ("127.0.0.1", port))


def wait_until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_worker_with_the_token_is_heard_and_acknowledged_with_the_generation():
    hb = listener(generation=2)
    sender = HeartbeatSender("a", "the-token", ("127.0.0.1", hb.port), source="127.0.0.1", period_s=0.05,
                             orphan_after_s=10, probe_port=1).start()
    try:
        wait_until(lambda: sender.coordinator_generation == 2)
        assert sender.interrupt.is_set()  # generation 2 > the worker's 0: stop the round
        assert [b.device for b in hb.drain()][:1] == ["a"] and hb.dropped.count == 0
    finally:
        sender.stop()
        hb.stop()


def test_a_new_generation_is_announced_without_waiting_for_the_next_beat():
    hb = listener()
    sender = HeartbeatSender("a", "the-token", ("127.0.0.1", hb.port), source="127.0.0.1", period_s=30,
                             orphan_after_s=100, probe_port=1).start()
    try:
        wait_until(lambda: hb._senders)  # the first beat went out; the next one is 30 s away
        hb.generation = 1
        hb.announce()
        wait_until(sender.interrupt.is_set, timeout_s=5.0)
        assert sender.coordinator_generation == 1
    finally:
        sender.stop()
        hb.stop()


def test_a_wrong_token_cannot_heartbeat_and_is_logged():
    hb = listener()
    sender = HeartbeatSender("a", "another-token", ("127.0.0.1", hb.port), source="127.0.0.1", period_s=0.05,
                             orphan_after_s=0.5, probe_port=1).start()
    try:
        wait_until(lambda: hb.dropped.count >= 3)
        assert hb.drain() == [] and all("wrong or missing run token" in d for d in hb.dropped.recent())
        wait_until(sender.orphaned.is_set)  # never acknowledged: the worker would stop
        assert sender.orphaned.is_set()
    finally:
        sender.stop()
        hb.stop()


def test_a_missing_token_is_dropped():
    hb = listener()
    try:
        send_from("127.0.0.1", hb.port, b'{"kind":"heartbeat","device":"a"}')
        wait_until(lambda: hb.dropped.count)
        assert hb.drain() == [] and "wrong or missing run token" in hb.dropped.recent()[0]
    finally:
        hb.stop()


def test_a_valid_heartbeat_from_an_unknown_address_is_ignored():
    hb = listener()
    beat = sign("the-token", {"kind": "heartbeat", "device": "a", "seq": 1, "round": 5})
    try:
        send_from("127.0.0.2", hb.port, beat)  # loopback, but not device a's address
        wait_until(lambda: hb.dropped.count)
        assert hb.drain() == [] and "not an address of device 'a'" in hb.dropped.recent()[0]
        send_from("127.0.0.1", hb.port, beat)
        wait_until(lambda: hb._beats)
        assert [b.message.round for b in hb.drain()] == [5]
    finally:
        hb.stop()


def test_a_heartbeat_for_an_unknown_device_is_ignored():
    hb = listener()
    try:
        send_from("127.0.0.1", hb.port, sign("the-token", {"kind": "heartbeat", "device": "mallory"}))
        wait_until(lambda: hb.dropped.count)
        assert hb.drain() == [] and "unknown device 'mallory'" in hb.dropped.recent()[0]
    finally:
        hb.stop()


def test_the_coordinator_listens_only_on_its_address():
    hb = listener()
    beat = sign("the-token", {"kind": "heartbeat", "device": "a", "seq": 1})
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(beat, ("127.0.0.2", hb.port))  # another address of this machine, same port
        time.sleep(0.5)
        assert hb.drain() == [] and hb.dropped.count == 0  # never reached the socket
    finally:
        hb.stop()


def test_probe_answers_only_with_the_token():
    responder = ProbeResponder("127.0.0.1", "the-token", "a").start()
    try:
        assert probe("127.0.0.1", responder.port, "the-token", "a", timeout_s=2.0)
        assert not probe("127.0.0.1", responder.port, "another-token", "a", timeout_s=2.0)
        assert not probe("127.0.0.1", responder.port, "the-token", "b", timeout_s=2.0)
    finally:
        responder.stop()


def test_probe_of_a_closed_port_fails_fast():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert not probe("127.0.0.1", port, "the-token", "a", timeout_s=1.0)


def test_a_worker_with_a_wrong_token_cannot_join_the_run():
    import pytest

    from hppctl.errors import RuntimeFailure
    from hppctl.runtime import bootstrap

    run = bootstrap.RunStore.start("127.0.0.1", token="the-token", timeout_s=5)
    try:
        nonce = run.publish_nonce()
        intruder = bootstrap.connect_store("127.0.0.1", run.port, "another-token", timeout_s=5)
        with pytest.raises(RuntimeFailure):  # it cannot even see the run's nonce under its prefix
            bootstrap.wait_for(lambda: intruder.check(["nonce"]), 1.0, "the nonce")
        intruder.set("join/a", bootstrap.join_proof("another-token", nonce, "a"))
        assert run.joined("a", nonce) is None  # nothing arrived under the run's keys
        honest = bootstrap.connect_store("127.0.0.1", run.port, "the-token", timeout_s=5)
        honest.set("join/a", bootstrap.join_proof("another-token", nonce, "a"))  # a forged proof
        assert run.joined("a", nonce) is False
    finally:
        run.close()
