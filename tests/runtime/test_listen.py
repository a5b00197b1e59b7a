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


# --- IPv6 (issue 23, item 10): the route lookup and the interface, then a real run on ::1 -----------

def test_route_lookup_takes_either_family_and_refuses_a_name_that_does_not_resolve():
    from hppctl.runtime.bootstrap import interface_for, route_source

    assert route_source("127.0.0.1") == "127.0.0.1"
    assert route_source("::1") == "::1"
    assert interface_for("::1") == "lo" and interface_for("127.0.0.1") == "lo"
    with pytest.raises(BadInput, match="'no-such-host.invalid' does not resolve"):
        route_source("no-such-host.invalid")


@pytest.mark.gloo
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault_tolerant", [False, True])
def test_a_run_hosts_its_store_on_ipv6_loopback(cli, tmp_path, fault_tolerant):
    """`--listen [::1]`: the store listens on ::1 only and local workers reach it (gloo over lo);
    with a profile the run is fault-tolerant, and heartbeats and probes use ::1 as well."""
    import json

    from hppctl.store import save
    from tests.recovery.factories import preset_profile
    from tests.runtime.factories import local_cluster

    save(tmp_path / "cluster.yaml", local_cluster("a", "b"))
    save(tmp_path / "profile.json", preset_profile("tiny-mlp", {"a": "jetson-nano", "b": "jetson-tx2"}))
    assert cli("plan", "--profile", tmp_path / "profile.json", "--global-batch", 8, "--micro-batch", 4,
               "--strategy", "pp", "--out", tmp_path / "plan.yaml")[0] == 0
    profile = ["--profile", tmp_path / "profile.json"] if fault_tolerant else []
    code, out, err = cli("run", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "cluster.yaml",
                         "--rounds", "2", "--dataset", "digits", "--listen", "[::1]:0", "--json", *profile)
    assert code == 0, err
    assert json.loads(out)["rounds_run"] == 2
