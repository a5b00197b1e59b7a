"""The address watch's parts on loopback (no root): finding this process's client socket, cutting a
call blocked on it, telling a gone address from others. The whole path (a run whose address is taken
away) is tests/lab/test_store_address_lost.py, which also checks that SSH workers whose launcher
went silent end (`hang_up_when_silent`)."""

from __future__ import annotations

import errno
import socket
import threading

from hppctl.runtime.address_watch import (AddressWatch, address_gone, hang_up_when_silent, is_loopback, plain_address,
                                          sockets_connected_to)


def test_an_ipv4_mapped_peer_reads_as_its_ipv4_address():
    assert plain_address("::ffff:10.213.0.1") == "10.213.0.1"
    assert plain_address("::ffff:1") == "::ffff:1"  # not a mapped IPv4 address
    assert plain_address("fe80::1") == "fe80::1"


def test_loopback_addresses_are_told_from_others():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("127.1.2.3")
    assert not is_loopback("10.213.0.1") and not is_loopback("fe80::1%eth0") and not is_loopback("myhost")


def test_only_an_address_this_machine_lacks_reads_as_gone():
    gone = address_gone("192.0.2.1")  # TEST-NET-1: nobody's
    assert gone is not None and gone.errno == errno.EADDRNOTAVAIL
    assert address_gone("127.0.0.1") is None


def test_cutting_the_found_client_socket_ends_a_call_blocked_on_it():
    """What the watch does to torch's store client, on a plain socket: a thread blocked in recv
    (the server never answers) returns at once when the duplicate found by peer is shut down."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(client.recv(10)))
    reader.start()
    try:
        found = sockets_connected_to("127.0.0.1", port)
        assert [s.getsockname() for s in found] == [client.getsockname()]  # not the accepted end
        found[0].shutdown(socket.SHUT_RDWR)
        reader.join(timeout=30)
        assert got == [b""] and not reader.is_alive()
        for sock in found:
            sock.close()
        assert client.fileno() >= 0  # the owner's descriptor stays open
    finally:
        for sock in (client, accepted, server):
            sock.close()


def test_a_watch_on_an_address_that_stays_reports_nothing_and_stops():
    server = socket.create_server(("127.0.0.1", 0))
    try:
        watch = AddressWatch("127.0.0.1", server.getsockname()[1], interval_s=0.01)
        threading.Event().wait(0.05)
        assert watch.lost is None
        watch.stop()
        watch.stop()
    finally:
        server.close()


def test_a_failed_store_call_is_one_line_naming_the_store_and_other_errors_pass_through():
    from torch.distributed import DistNetworkError

    from hppctl.runtime.bootstrap import RunStore

    store = RunStore("10.213.0.1", 29500, "token", store=None, raw=None)
    failure = store.failure(DistNetworkError("Failed to recv, got 0 bytes.\nException raised from recvBytes at …"))
    assert str(failure) == "the run's store on 10.213.0.1:29500 failed: Failed to recv, got 0 bytes."
    assert failure.exit_code == 1
    assert store.failure(ValueError("a bug")) is None


def test_a_workers_store_connection_is_ended_by_the_kernel_after_the_silence_it_is_given():
    """The options `hang_up_when_silent` leaves on the client connection, found through a name
    (`localhost`), and only on connections to the store's port; an unresolvable name sets nothing."""
    server = socket.create_server(("127.0.0.1", 0))
    other = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    unrelated = socket.create_connection(("127.0.0.1", other.getsockname()[1]))
    try:
        assert hang_up_when_silent("localhost", port, 30.0) == 1
        assert client.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 30_000
        idle = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
        every = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
        count = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
        assert idle + every * count <= 30 + every  # the probes fit the silence allowed
        assert unrelated.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
        assert hang_up_when_silent("no-such-host.invalid", port, 30.0) == 0
    finally:
        for sock in (client, unrelated, server, other):
            sock.close()
