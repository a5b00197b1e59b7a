"""Any bytes on the heartbeat and probe ports are untrusted: none may stop a listener (no processes).

Issue 23 item 1: the 4-byte datagram b"x\\t\\xc3\\xa9" (a non-ASCII "MAC") made `hmac.compare_digest`
raise TypeError inside the listener thread, which died: acknowledgements stopped, every worker
declared itself orphaned and the run ended. The probe responder served one connection at a time
with a 2 s read timeout, so one idle connection made the coordinator's probe fail.
"""

from __future__ import annotations

import socket
import time

import pytest

from hppctl.runtime.heartbeat import HeartbeatListener, HeartbeatSender, ProbeResponder, probe, sign

HOSTILE = [b"x\t\xc3\xa9", b"\t", b"", b"\xff" * 2048, b"{}\t" + b"a" * 64, b"\t\xc3\xa9" * 600,
           b'{"kind":"heartbeat"}\t\xe2\x82\xac']


def wait_until(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return bool(predicate())


def send(port: int, data: bytes) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(data, ("127.0.0.1", port))


def test_a_non_ascii_mac_does_not_stop_the_coordinators_listener():
    hb = HeartbeatListener("127.0.0.1", "the-token", {"a": {"127.0.0.1"}}).start()
    sender = None
    try:
        for data in HOSTILE:
            send(hb.port, data)
        assert wait_until(lambda: hb.dropped.count >= len(HOSTILE) - 1)  # b"" may not count as a datagram
        sender = HeartbeatSender("a", "the-token", ("127.0.0.1", hb.port), source="127.0.0.1", period_s=0.05,
                                 orphan_after_s=10, probe_port=1).start()
        hb.generation = 1
        assert wait_until(lambda: sender.coordinator_generation == 1)  # still heard and acknowledged
        assert not sender.orphaned.is_set()
    finally:
        if sender is not None:
            sender.stop()
        hb.stop()


def test_a_non_ascii_ack_does_not_stop_the_workers_listener():
    hb = HeartbeatListener("127.0.0.1", "the-token", {"a": {"127.0.0.1"}}).start()
    sender = HeartbeatSender("a", "the-token", ("127.0.0.1", hb.port), source="127.0.0.1", period_s=0.05,
                             orphan_after_s=10, probe_port=1).start()
    try:
        for data in HOSTILE:
            send(sender.port, data)
        time.sleep(0.3)
        hb.generation = 3
        hb.announce()
        assert wait_until(lambda: sender.coordinator_generation == 3)  # acknowledgements still read
    finally:
        sender.stop()
        hb.stop()


def test_hostile_probe_connections_do_not_stop_the_probe_responder():
    responder = ProbeResponder("127.0.0.1", "the-token", "a").start()
    held = []
    try:
        for data in (b"x\t\xc3\xa9\n", b"\xff" * 4096, b"no newline", b"\n"):
            with socket.create_connection(("127.0.0.1", responder.port), timeout=2) as conn:
                conn.sendall(data)
        for _ in range(20):  # slow-loris: connections that never send a nonce, held open
            held.append(socket.create_connection(("127.0.0.1", responder.port), timeout=2))
        assert probe("127.0.0.1", responder.port, "the-token", "a", timeout_s=2.0)
    finally:
        for conn in held:
            conn.close()
        responder.stop()


def test_one_idle_connection_does_not_make_the_probe_fail():
    responder = ProbeResponder("127.0.0.1", "the-token", "a").start()
    try:
        with socket.create_connection(("127.0.0.1", responder.port), timeout=2):
            time.sleep(0.2)  # accepted by the responder: the old one then read it for 2 s, alone
            assert probe("127.0.0.1", responder.port, "the-token", "a", timeout_s=1.0)
    finally:
        responder.stop()


# --- pure: verify, accept and the drop log, for any bytes ---------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hppctl.models.beats import HeartbeatMessage  # noqa: E402
from hppctl.runtime.heartbeat import MAX_REASON_CHARS, RECENT_REASONS, DropLog, verify  # noqa: E402


@given(st.binary(max_size=2100))
@settings(max_examples=300, deadline=None)
def test_verify_returns_none_for_any_unsigned_bytes(data):
    assert verify("the-token", data) is None


@given(st.binary(max_size=300), st.text(max_size=70))
@settings(max_examples=300, deadline=None)
def test_verify_never_raises_on_a_tab_and_any_mac(body, mac):
    assert verify("the-token", body + b"\t" + mac.encode("utf-8", "surrogatepass")) is None


@given(st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8) | st.floats(allow_nan=False), max_size=6))
@settings(max_examples=200, deadline=None)
def test_a_signed_document_verifies_and_only_with_its_own_token(doc):
    data = sign("the-token", doc)
    assert verify("the-token", data) == doc
    assert verify("another-run", data) is None


@given(st.binary(max_size=2100))
@settings(max_examples=200, deadline=None)
def test_accept_drops_any_bytes_without_raising(data):
    hb = HeartbeatListener("127.0.0.1", "the-token", {"a": {"127.0.0.1"}})
    assert hb.accept(data, "127.0.0.1") is None and hb.dropped.count == 1


def beat(seq: int, **fields) -> bytes:
    return sign("the-token", {"kind": "heartbeat", "device": "a", "seq": seq, "round": 0, **fields})


def test_a_replayed_or_older_beat_is_dropped():
    hb = HeartbeatListener("127.0.0.1", "the-token", {"a": {"127.0.0.1"}})
    assert hb.accept(beat(5), "127.0.0.1") is not None
    for seq in (5, 4, 1, 0):
        assert hb.accept(beat(seq), "127.0.0.1") is None
    assert hb.accept(beat(6), "127.0.0.1") is not None
    assert hb.dropped.count == 4 and all("replayed beat" in r for r in hb.dropped.recent())


def test_a_valid_mac_of_another_run_is_dropped():
    hb = HeartbeatListener("127.0.0.1", "the-token", {"a": {"127.0.0.1"}})
    other = sign("another-run", {"kind": "heartbeat", "device": "a", "seq": 1})
    assert hb.accept(other, "127.0.0.1") is None and "wrong or missing run token" in hb.dropped.recent()[0]


@pytest.mark.parametrize("fields", [{"round": -1}, {"round": "7"}, {"round": 1.5}, {"samples_per_s": float("inf")},
                                    {"samples_per_s": "fast"}, {"probe_port": 70000}, {"generation": True}])
def test_a_signed_beat_with_fields_of_the_wrong_type_is_dropped(fields):
    # the coordinator reads them as int/float: a bad one used to end its loop (int("x"), pydantic ge=0)
    with pytest.raises(ValueError):
        HeartbeatMessage.model_validate({"kind": "heartbeat", "device": "a", "seq": 1, **fields})
    hb = HeartbeatListener("127.0.0.1", "the-token", {"a": {"127.0.0.1"}})
    assert hb.accept(beat(1, **fields), "127.0.0.1") is None and "malformed" in hb.dropped.recent()[0]


def test_the_drop_log_stays_small_under_a_flood():
    # issue 23 item 2: every reason was kept in a list, never trimmed
    hb = HeartbeatListener("127.0.0.1", "the-token", {"a": {"127.0.0.1"}})
    for i in range(20_000):
        hb.accept(b"x" * 2000 + str(i).encode(), "127.0.0.1")
    hb.accept(sign("the-token", {"kind": "heartbeat", "device": "m" * 1500}), "127.0.0.1")
    assert hb.dropped.count == 20_001
    recent = hb.dropped.recent()
    assert len(recent) == RECENT_REASONS and all(len(r) <= MAX_REASON_CHARS for r in recent)
    assert hb.dropped.recent(after=20_000) == [recent[-1]]


def test_drop_log_is_safe_to_read_while_written():
    log = DropLog()
    log.add("x" * 10_000)
    assert log.recent() == ["x" * (MAX_REASON_CHARS - 1) + "…"]


def test_a_flood_of_drops_makes_one_dropped_event_per_interval_with_the_count():
    # issue 23 item 2: 65k datagrams in 15 s wrote 10,989 "dropped" events (20 per coordinator loop)
    from hppctl.runtime.ft_detection import DROPPED_EVENT_EVERY_S, DROPPED_SAMPLES, dropped_event

    events, seen, last_at = [], 0, float("-inf")
    for tick in range(750):  # the coordinator's loop: every 20 ms for 15 s, ~87 new drops each time
        now, total = tick * 0.02, (tick + 1) * 87
        fields = dropped_event(total, seen, [f"from 10.0.0.{i % 5}: wrong or missing run token" for i in range(8)],
                               since_last_s=now - last_at)
        if fields is not None:
            events.append(fields)
            seen, last_at = fields["total"], now
    final = dropped_event(750 * 87, seen, ["the last"], since_last_s=0.0, final=True)
    events.append(final)
    assert len(events) <= 15 / DROPPED_EVENT_EVERY_S + 2
    assert sum(e["count"] for e in events) == 750 * 87 and events[-1]["total"] == 750 * 87
    assert all(len(e["samples"]) <= DROPPED_SAMPLES for e in events)
    assert dropped_event(10, 10, [], since_last_s=1e9, final=True) is None  # nothing new: no event
