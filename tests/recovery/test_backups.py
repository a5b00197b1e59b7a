"""A backup's bytes arrive while its holder trains on (replication.Backups.receive_later).

The holder used to wait for every backup inside the round's backup step: on the Env D lab that was
1.0-1.2 s of every round and of every recovery (bench/recovery.py's `backup` step). The comm here is
the threaded queue comm of the Bi-Partition tests (a stand-in for gloo's point-to-point calls).
"""

from __future__ import annotations

import threading

import torch

from hppctl.runtime.replication import BYTES_TAG, LENGTH_TAG, Backups, send_bytes
from tests.bipartition.threaded import Mailboxes, QueueComm


def test_the_holder_goes_on_before_the_bytes_arrive_and_holds_only_complete_backups():
    queues = Mailboxes()
    sender, holder = QueueComm("a", queues), QueueComm("b", queues)
    data = bytes(range(256)) * 40
    sender.isend(torch.tensor([len(data)], dtype=torch.int64), "b", LENGTH_TAG)  # the length first...
    backups = Backups()
    backups.receive_later(holder, "a", 4)  # returns with the bytes still on the wire
    assert backups.inventory() == {}  # a re-plan now must not count on round 4
    sender.isend(torch.frombuffer(bytearray(data), dtype=torch.uint8), "b", BYTES_TAG)  # ...the bytes later
    assert backups.settle(threading.Event())
    assert backups.inventory() == {"a": [4]} and backups.get("a", 4) == data


def test_settle_gives_up_when_the_coordinator_interrupts():
    queues = Mailboxes()
    QueueComm("a", queues).isend(torch.tensor([10], dtype=torch.int64), "b", LENGTH_TAG)  # the bytes never come
    backups, abort = Backups(), threading.Event()
    backups.receive_later(QueueComm("b", queues), "a", 2)
    threading.Timer(0.2, abort.set).start()
    assert backups.settle(abort) is False  # had it waited out the queue's 60 s, the thread would be gone: True
    assert backups.inventory() == {}


class FailingComm(QueueComm):
    def irecv(self, tensor, peer, tag):
        work = super().irecv(tensor, peer, tag)
        if tag == BYTES_TAG:
            class Broken:
                def wait(self):
                    raise RuntimeError("Connection closed by peer")
            return Broken()
        return work


def test_a_transfer_that_breaks_leaves_nothing_behind():
    queues = Mailboxes()
    send_bytes(QueueComm("a", queues), b"x" * 100, "b")
    backups = Backups()
    backups.receive_later(FailingComm("b", queues), "a", 3)
    assert backups.settle(threading.Event())
    assert backups.inventory() == {}
