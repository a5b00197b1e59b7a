"""Tier 2 (gloo): hostile traffic against a live fault-tolerant run changes nothing (issue 23).

A real `FtSession` (the coordinator `hppctl run` embeds: heartbeat listener, probes,
re-planning) trains tiny-mlp on local worker processes. While it trains, this test sends the
coordinator's heartbeat port random and adversarial datagrams (non-ASCII, oversized, truncated,
beats of another run, exact replays of a worker's first beat), and a worker's probe port TCP
connections that send garbage or nothing at all (slow-loris), probing that worker meanwhile as
the coordinator does. The run must end with the parameters of the undisturbed loop, no device
lost, every probe answered, and the "dropped" events and the metrics stream bounded.
"""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time

import pytest

from hppctl.models.events import state_line
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.ft_detection import DROPPED_EVENT_EVERY_S
from hppctl.runtime.heartbeat import RECENT_REASONS, probe, sign
from hppctl.runtime.ft_session import RecoveryOptions, FtSession
from hppctl.runtime.session import RunRequest
from tests.recovery.factories import preset_profile
from tests.recovery.test_replay import assert_same
from tests.runtime.factories import local_cluster, make_plan

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(400)]

ROUNDS = 400
STAGES = [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])]


class Attack:
    """Threads that send hostile traffic at the live run until `stop()`."""

    def __init__(self, session: FtSession, victim: str, seed: int = 23) -> None:
        self.session, self.victim, self.rng = session, victim, random.Random(seed)
        self.datagrams = 0
        self.probes: list[bool] = []
        self.connections = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._datagrams, daemon=True),
                         threading.Thread(target=self._probe_port, daemon=True)]

    def start(self) -> "Attack":
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    # --- the heartbeat port ------------------------------------------------------------------------
    def _hostile_datagram(self, token: str, first_beat: bytes | None) -> bytes:
        rng = self.rng
        kind = rng.randrange(8)
        if kind == 0:
            return b"x\t\xc3\xa9"  # the datagram: it used to end the coordinator's listener
        if kind == 1:
            return rng.randbytes(rng.randrange(0, 3000))
        if kind == 2:
            return "".join(chr(rng.randrange(0x80, 0x2FFF)) for _ in range(rng.randrange(1, 400))).encode(
                "utf-8", "surrogatepass") + b"\t" + rng.randbytes(64)
        if kind == 3:
            return b"\t" * rng.randrange(1, 60_000)  # oversized: cut to 2048 by the listener
        beat = {"kind": rng.choice(["heartbeat", "leave"]), "device": rng.choice(["a", "b", "mallory"]),
                "seq": rng.randrange(1, 10**9), "round": rng.randrange(0, 50), "generation": 0,
                "samples_per_s": 1.0, "probe_port": 1}
        if kind == 4:
            return sign("another-run-" + "0" * 52, beat)  # a valid MAC with another run's token
        if kind == 5:
            valid = sign(token, beat)
            return valid[:rng.randrange(1, len(valid))]  # truncated
        if kind == 6 and first_beat is not None:
            return first_beat  # an exact replay of worker a's first beat (seq 1, round 0)
        return sign(token, {**beat, "device": "a", "seq": rng.randrange(-5, 2), "round": -1})

    def _first_beat_of_a(self, token: str) -> bytes | None:
        where = self.session.detector.probe_address("a")
        if where is None:
            return None
        return sign(token, {"kind": "heartbeat", "device": "a", "seq": 1, "generation": 0, "round": 0,
                            "samples_per_s": 0.0, "probe_port": where[1]})

    def _datagrams(self) -> None:
        token, port = self.session.store.token, self.session.detector.listener.port
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            while not self._stop.is_set():
                first_beat = self._first_beat_of_a(token)
                for _ in range(40):
                    try:
                        s.sendto(self._hostile_datagram(token, first_beat), ("127.0.0.1", port))
                        self.datagrams += 1
                    except OSError:  # EMSGSIZE and the like: the datagram never left
                        pass
                time.sleep(0.02)  # ~2000 datagrams/s: a flood the 2-core test machine can also train through

    # --- the probe port ------------------------------------------------------------------------------
    def _probe_port(self) -> None:
        while self.session.detector.probe_address(self.victim) is None and not self._stop.is_set():
            time.sleep(0.05)
        if self._stop.is_set():
            return
        host, port = self.session.detector.probe_address(self.victim)
        held: list[socket.socket] = []
        try:
            while not self._stop.is_set():
                for _ in range(8):  # slow-loris: connect, send nothing, keep it open
                    held.append(self._connect(host, port))
                for data in (b"x\t\xc3\xa9\n", self.rng.randbytes(5000), b"0" * 31, b"\n" * 10):
                    conn = self._connect(host, port)
                    if conn is not None:
                        try:
                            conn.sendall(data)
                        except OSError:
                            pass
                        conn.close()
                self.probes.append(probe(host, port, self.session.store.token, self.victim, timeout_s=2.0))
                while len(held) > 64:  # keep ~64 idle connections open at any time
                    conn = held.pop(0)
                    if conn is not None:
                        conn.close()
                time.sleep(0.1)
        finally:
            for conn in held:
                if conn is not None:
                    conn.close()

    def _connect(self, host: str, port: int) -> socket.socket | None:
        try:
            conn = socket.create_connection((host, port), timeout=2)
            self.connections += 1
            return conn
        except OSError:
            return None


def ft_session(plan, options) -> FtSession:
    return FtSession(RunRequest(plan, local_cluster(*plan.devices()), options),
                            RecoveryOptions(profile=preset_profile("tiny-mlp", {"a": "jetson-nano", "b": "jetson-tx2"}),
                                            heartbeat_s=0.5, timeout_s=3.0, probe_s=2.0))


def test_hostile_datagrams_and_connections_change_nothing(tmp_path):
    plan = make_plan("tiny-mlp", STAGES, global_batch=16, micro_batch=4)
    options = TrainOptions(rounds=ROUNDS, threads=1, dataset="synthetic", lr=0.1)
    # the reference: the same plan and seed, run the same way, undisturbed (hundreds of rounds of
    # pipelined float arithmetic drift from the single-process loop of tests/runtime/reference.py)
    undisturbed = ft_session(plan, options).run()
    session = ft_session(plan, options)
    metrics = tmp_path / "metrics.jsonl"
    attack: list[Attack] = []

    with open(metrics, "w") as out:
        def write(line: dict) -> None:  # what `hppctl run --metrics` writes (hppctl/driver.py: train)
            out.write(json.dumps(line) + "\n")

        def on_round(row: dict) -> None:
            write(row)
            if row["round"] == ROUNDS - 1:  # before the workers end (their probe ports with them)
                for a in attack:
                    a.stop()

        def on_fault(event) -> None:
            write(event.wire())
            if event.event == "armed":  # every worker trains: the attack starts
                attack.append(Attack(session, victim="b").start())

        def on_state(event) -> None:
            write(state_line(event))

        began = time.monotonic()
        try:
            result = session.run(on_round=on_round, on_fault=on_fault, on_state=on_state)
        finally:
            for a in attack:
                a.stop()
        wall_s = time.monotonic() - began

    (a,) = attack
    print(f"wall {wall_s:.1f} s, {a.datagrams} datagrams, {a.connections} connections, {len(a.probes)} probes, "
          f"dropped {session.detector.listener.dropped.count}, metrics {os.path.getsize(metrics)} bytes")
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    kinds = [line.get("event") for line in lines]
    assert a.datagrams > 1000 and a.connections > 50, (a.datagrams, a.connections)
    # the run: every round once, nobody lost or re-planned, the parameters of the undisturbed loop
    assert [row["round"] for row in result.rounds] == list(range(ROUNDS))
    assert "lost" not in kinds and "replanned" not in kinds and session.lost == []
    assert_same(result.model_state(), undisturbed.model_state())
    # the probe port: the coordinator's probe got through every time, slow-loris and garbage meanwhile
    assert a.probes and all(a.probes), [i for i, ok in enumerate(a.probes) if not ok] + [len(a.probes)]
    # bounded: one "dropped" event per interval (and a last one), counting every refused datagram
    dropped = [line for line in lines if line.get("event") == "dropped"]
    assert 1 <= len(dropped) <= wall_s / DROPPED_EVENT_EVERY_S + 2, (len(dropped), wall_s)
    assert sum(e["count"] for e in dropped) == session.detector.listener.dropped.count == dropped[-1]["total"]
    assert session.detector.listener.dropped.count > 1000
    assert all(len(e["samples"]) <= 3 and all(len(r) <= 160 for r in e["samples"]) for e in dropped)
    assert len(session.detector.listener.dropped.recent()) <= RECENT_REASONS
    # the coordinator's state log: bounded in memory, complete in the stream; nothing but real beats in it
    state = [line for line in lines if line.get("event") == "state"]
    assert len(session.detector.state.log) <= 512 and len(state) == session.detector.state.applied
    assert {line["kind"] for line in state} == {"heartbeat"}
    assert len(state) <= 2 * (wall_s / 0.5 + 2)  # two devices, a beat each per 0.5 s: no forged one counted
    assert os.path.getsize(metrics) < 2_000_000
