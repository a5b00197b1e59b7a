"""The run's TCPStore: where it listens, and what the launcher takes back from it (issue 23 item 4).

torch's store server accepts any key from anyone who reaches its port (no quota: junk keys grow the
launcher's memory, which hppctl cannot bound); the run's own keys sit under a token-derived prefix.
What the launcher reads there it bounds: these tests write, with the token, what a sniffer of the
(unencrypted) store traffic could write, and expect a one-line refusal instead of a hang or a
traceback. No processes: a real store in this process.
"""

from __future__ import annotations

import socket

import pytest

from hppctl.errors import RuntimeFailure
from hppctl.runtime import bootstrap


@pytest.fixture
def run():
    run = bootstrap.RunStore.start("127.0.0.1", token="the-token", timeout_s=2)
    yield run
    run.close()


def worker_side(run):
    return bootstrap.connect_store("127.0.0.1", run.port, "the-token", timeout_s=2)


def test_the_store_listens_on_its_address_only(run):
    with socket.socket() as s:  # another address of this machine, the same port: nothing listens there
        assert s.connect_ex(("127.0.0.2", run.port)) != 0
    with socket.create_connection(("127.0.0.1", run.port), timeout=2):
        pass


def test_a_join_proof_that_is_not_text_is_refused_not_a_traceback(run):
    # before: .decode() raised UnicodeDecodeError in the launcher's admission loop
    nonce = run.publish_nonce()
    worker_side(run).set("join/a", b"\xff\xfe" * 8)
    assert run.joined("a", nonce) is False
    worker_side(run).set("join/a", bootstrap.join_proof("the-token", nonce, "a"))
    assert run.joined("a", nonce) is True


@pytest.mark.parametrize("count", [b"99999999999", b"-1", b"0", b"\xff", b"1e9"])
def test_a_blob_with_an_absurd_chunk_count_is_refused_at_once(run, count):
    # before: int(b"99999999999") chunks were read one by one (each a store wait), -1 read nothing
    worker_side(run).set("ckpt/3/0/n", count)
    with pytest.raises(RuntimeFailure, match=r"'ckpt/3/0' has .* chunks"):
        bootstrap.get_blob(run.store, "ckpt/3/0")


def test_a_value_grown_past_what_a_worker_writes_is_refused(run):
    store = worker_side(run)
    store.set("metrics/0/a", b"{}")
    for _ in range(3):  # append: the only way past the server's own 8 MiB per value
        store.append("metrics/0/a", b" " * (4 * 2**20))
    # torch's client sends an append without waiting for the server; a call that is answered, on the
    # same connection, is served after them (without it the launcher's read raced them: 8 in 100 here
    # beside a busy core, and once in CI)
    assert store.check(["metrics/0/a"])
    with pytest.raises(RuntimeFailure, match="more than the 8388608 a worker writes there"):
        bootstrap.read_json(run.store, "metrics/0/a")


@pytest.mark.parametrize("value", [b"[" * 200_000, b"\xff\xfe", b"[1, 2]", b"nan"])
def test_a_report_that_is_not_a_json_object_is_refused(run, value):
    worker_side(run).set("metrics/0/a", value)
    with pytest.raises(RuntimeFailure, match="other than a worker's report under 'metrics/0/a'"):
        bootstrap.read_json(run.store, "metrics/0/a")


def test_a_chunk_longer_than_a_chunk_is_refused(run):
    store = worker_side(run)
    store.set("final/0/n", b"1")
    store.set("final/0/0", b"x" * (bootstrap.CHUNK_BYTES + 1))
    with pytest.raises(RuntimeFailure, match="under 'final/0/0'"):
        bootstrap.get_blob(run.store, "final/0")
