"""`--listen HOST[:PORT]`: one parser for every command that hosts a run's store (pure, and one bind)."""

from __future__ import annotations

import pytest

from hppctl.errors import BadInput
from hppctl.runtime.bootstrap import check_listen, parse_listen


@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1", ("127.0.0.1", 0)),
    ("10.213.0.1:29500", ("10.213.0.1", 29500)),
    ("localhost:0", ("localhost", 0)),
    ("::1", ("::1", 0)),  # a bare IPv6 address has no port
    ("[::1]:29500", ("::1", 29500)),
    ("[fe80::1]", ("fe80::1", 0)),
])
def test_addresses_parse_to_host_and_port(text, expected):
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text, message", [
    (":29500", "has no host"),
    ("[]:1", "has no host"),
    ("127.0.0.1:http", "port 'http' is not a number"),
    ("127.0.0.1:-1", "port -1 is out of range"),
    ("127.0.0.1:65536", "port 65536 is out of range"),
])
def test_bad_addresses_name_the_flag_and_value(text, message):
    with pytest.raises(BadInput) as caught:
        parse_listen(text)
    assert str(caught.value).startswith(f"--listen: {text!r}") and message in str(caught.value)


def test_only_this_machines_addresses_pass_the_check():
    check_listen("127.0.0.1:0")
    check_listen(None)
    with pytest.raises(BadInput, match="this machine cannot listen on 192.0.2.1"):  # TEST-NET-1: nobody's
        check_listen("192.0.2.1")
