"""The coordinator's state machine: failure stories as event lists, fake clock."""

from hppctl.ft.state import CoordinatorState, apply, find_suspects
from hppctl.models.events import Heartbeat, Lost, ProbeAnswered, Replanned


def run(state, *events):
    for e in events:
        state = apply(state, e)
    return state


def test_silent_device_becomes_suspect_then_lost():
    s = CoordinatorState.start(["a", "b"])
    s = run(s, Heartbeat(device="a", at_s=1.0, round=1), Heartbeat(device="b", at_s=1.0, round=1),
            Heartbeat(device="a", at_s=4.5, round=2))
    suspects = find_suspects(s, now_s=4.6, timeout_s=3.0)
    assert [x.device for x in suspects] == ["b"] and suspects[0].silent_s > 3.0
    s = run(s, *suspects)
    assert s.devices["b"].health == "suspect"
    s = apply(s, Lost(device="b", at_s=6.0, reason="probe unanswered"))
    assert s.live() == ["a"] and s.completed_round == 2


def test_probe_answer_clears_suspicion():
    s = CoordinatorState.start(["a"])
    s = run(s, *find_suspects(s, now_s=10, timeout_s=3))
    assert s.devices["a"].health == "suspect"
    s = apply(s, ProbeAnswered(device="a", at_s=10.5))
    assert s.devices["a"].health == "alive" and not find_suspects(s, now_s=11, timeout_s=3)


def test_heartbeats_from_unknown_or_lost_devices_change_nothing():
    s = CoordinatorState.start(["a", "b"])
    s = apply(s, Lost(device="b", at_s=1, reason="killed"))
    after = run(s, Heartbeat(device="b", at_s=2, round=9), Heartbeat(device="ghost", at_s=2, round=9))
    assert after.devices == s.devices and len(after.log) == 3


def test_completed_round_is_the_slowest_live_device_and_replan_resets_it():
    s = CoordinatorState.start(["a", "b", "c"])
    s = run(s, Heartbeat(device="a", at_s=1, round=5), Heartbeat(device="b", at_s=1, round=4),
            Heartbeat(device="c", at_s=1, round=3))
    assert s.completed_round == 3
    s = run(s, Lost(device="c", at_s=2, reason="link down"),
            Replanned(at_s=3, method="light", devices=["a", "b"], resume_round=3))
    assert set(s.devices) == {"a", "b"} and s.completed_round == 3


def test_a_long_run_keeps_a_bounded_log_and_streams_every_event_to_the_sink():
    # issue 23 item 3: the log was copied whole on every heartbeat (quadratic over a long run). The
    # cost of `apply` is that copy: bounded by LOG_WINDOW however many events came before.
    from hppctl.ft.state import LOG_WINDOW, apply_all

    beats = [Heartbeat(device="ab"[i % 2], at_s=i * 0.5, round=i // 10) for i in range(20 * LOG_WINDOW)]
    sink: list = []
    s = CoordinatorState.start(["a", "b"])
    lengths = []
    for chunk in range(0, len(beats), LOG_WINDOW):
        s = apply_all(s, beats[chunk:chunk + LOG_WINDOW], sink.append)
        lengths.append(len(s.log))
    assert max(lengths) == LOG_WINDOW and lengths[-1] == lengths[1]  # flat after the first window
    assert s.log == tuple(beats[-LOG_WINDOW:])  # the newest, in order
    assert sink == beats and s.applied == len(beats)  # nothing is lost to the window
    assert s.devices["b"].round == (len(beats) - 1) // 10 and s.devices["a"].last_heartbeat_s == (len(beats) - 2) * 0.5
