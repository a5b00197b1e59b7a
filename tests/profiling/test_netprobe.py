"""The link probe's goodput from the receiver's readings (pure), and one real transfer on loopback."""

from __future__ import annotations

import threading

import pytest

from hppctl.profiling import netprobe

RATE = 12.0e6  # bytes/s: 96 Mbit/s


def throttled_readings(rate: float = RATE, seconds: float = 1.0, period: float = 0.1, quota: float = 0.25,
                       phase: float = 0.05, slow_start: float = 0.05) -> list[tuple[float, int]]:
    """What a receiver on a `quota`-core device reads: bytes arrive at `rate` (half of it during slow
    start) into the socket buffer; the receiver runs the first `quota` of each period (shifted by
    `phase`), reading every millisecond, and drains the buffer whenever it runs."""
    def arrived(t: float) -> float:
        t = min(t, seconds)
        return rate * (0.5 * min(t, slow_start) + max(0.0, t - slow_start))

    readings, t, total = [], 0.0, 0
    while True:
        t += 0.001
        if ((t + phase) % period) >= quota * period:  # stopped for the rest of the period
            continue
        now = int(arrived(t))
        if now > total:
            total = now
            readings.append((t, total))
        if t >= seconds:
            if total >= int(arrived(seconds)):
                return readings


def first_to_last(readings):  # the estimator the probe used before
    (t0, b0), (t1, b1) = readings[0], readings[-1]
    return (b1 - b0) / (t1 - t0)


def test_a_late_last_reading_on_a_throttled_receiver_does_not_bias_the_goodput():
    # the transfer ends at 1.0 s while the receiver is stopped until 1.025 s (phase 0.05: it runs 0.05-0.075 of each period)
    readings = throttled_readings()
    assert readings[-1][0] > 1.02
    assert first_to_last(readings) < 0.97 * RATE  # the old figure: several % low
    assert netprobe.steady_rate(readings) == pytest.approx(RATE, rel=0.01)


@pytest.mark.parametrize("phase", [0.0, 0.02, 0.05, 0.08])
def test_the_goodput_holds_wherever_the_periods_fall(phase):
    assert netprobe.steady_rate(throttled_readings(phase=phase)) == pytest.approx(RATE, rel=0.015)


def test_degenerate_readings():
    assert netprobe.steady_rate([]) == 0.0
    assert netprobe.steady_rate([(1.0, 100)]) == 0.0
    assert netprobe.steady_rate([(1.0, 100), (2.0, 300)]) == pytest.approx(200.0)  # too few for a fit: the average


def test_a_whole_link_is_one_server_and_one_client_on_loopback():
    # both directions and the round trips from one launch on each side (a link used to take six)
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = netprobe.link_serve({"bind": "127.0.0.1", "peer": "127.0.0.1", "port": port, "seconds": 0.2, "count": 5,
                                 "timeout_s": 10})
    assert next(server)["type"] == "listening"
    served: list[dict] = []
    thread = threading.Thread(target=lambda: served.extend(server))
    thread.start()
    tested = list(netprobe.link_test({"to": "127.0.0.1", "port": port, "seconds": 0.2, "count": 5}))
    thread.join(10)
    assert [r["type"] for r in served] == ["recv", "send", "echo"] and served[0]["bound"] == "127.0.0.1"
    assert [r["type"] for r in tested] == ["send", "recv", "ping"]
    assert served[0]["bytes"] == tested[0]["bytes"] > 0  # client -> server, counted where it arrived
    assert tested[1]["bytes"] == served[1]["bytes"] > 0  # server -> client
    assert all(r["bytes_per_s"] > 0 and r["seconds"] > 0 for r in (served[0], tested[1]))
    assert len(tested[2]["rtt_s"]) == 5 and served[2]["echoed"] == 6  # the warm-up round trip is dropped
    assert all(r["refused"] == 0 for r in served)
