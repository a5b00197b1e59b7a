"""The barrier before each PSL batch names the devices it waited for in vain. gloo's barrier cannot
say who is missing: a client that stopped answering before its batch failed the others with "Timed
out waiting … for recv operation", naming no one. The barrier is now the run's store: each device
sets its key and waits for everyone's, and a timeout names those whose key never came. Real
`TCPStore` on loopback, one client connection per device (threads); no gloo."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from hppctl.runtime import wire
from hppctl.runtime.psl.worker import BatchBarrier

DEVICES = ["c0", "c1", "h0"]


@pytest.fixture
def stores():
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    clients = {d: TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=10)) for d in DEVICES}
    yield server, clients


def meet(barriers: dict[str, BatchBarrier], step: int) -> dict[str, str]:
    """Every barrier's `wait(step)` at once; what each raised ("" if it passed)."""
    outcome: dict[str, str] = {}

    def one(device: str) -> None:
        try:
            barriers[device].wait(step)
            outcome[device] = ""
        except RuntimeError as e:
            outcome[device] = str(e)

    threads = [threading.Thread(target=one, args=(d,)) for d in barriers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return outcome


def test_everyone_passes_and_the_store_keeps_two_steps_of_keys_at_most(stores):
    server, clients = stores
    barriers = {d: BatchBarrier(clients[d], d, DEVICES, timeout_s=5) for d in DEVICES}
    for step in range(4):
        assert meet(barriers, step) == {d: "" for d in DEVICES}
    assert server.check([wire.batch_ready(3, d) for d in DEVICES])
    # each device removed its key of step 1 once it passed step 2 (everyone had left step 1 then)
    assert not any(server.check([wire.batch_ready(s, d)]) for s in (0, 1) for d in DEVICES)


def test_a_device_that_never_arrives_is_named_by_everyone_waiting(stores):
    _, clients = stores
    waiting = {d: BatchBarrier(clients[d], d, DEVICES, timeout_s=1) for d in ("c0", "h0")}
    outcome = meet(waiting, 7)
    for device, message in outcome.items():
        assert message == f"{device}: waiting for every device before batch 7: nothing from c1 within 1 s", message
