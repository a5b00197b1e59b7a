"""The threaded test comm itself: it only takes lock-guarded mailboxes."""

from __future__ import annotations

import queue
from collections import defaultdict

import pytest

from tests.bipartition.threaded import Mailboxes, QueueComm


def test_queue_comm_refuses_a_plain_defaultdict_of_queues():
    # CI hung 60 s in test_receives on such a dict: two threads missing the same key at once each
    # made a queue, and the message put into the replaced one was never received.
    with pytest.raises(TypeError, match="Mailboxes"):
        QueueComm("a", defaultdict(queue.Queue))
    QueueComm("a", Mailboxes())
