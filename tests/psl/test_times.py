"""The six per-pair times and memory from a profile, and the input checks."""

import pytest

from hppctl.errors import BadInput, Infeasible
from hppctl.models.psl import PslRequest
from hppctl.planner.cost import CostModel
from hppctl.planner.psl import pair_times
from tests.conftest import make_profile


def request(**kw):
    base = dict(clients=["dev0", "dev1"], helpers=["dev2"], cuts=[[2, 5], [1, 4]], batch=16)
    return PslRequest(**(base | kw))


def test_times_follow_the_paper_composition():
    profile = make_profile(layers=6, speeds=(1, 2, 4), links=[("dev0", "dev2", 2e6)])
    times = pair_times(profile, request())
    cost = CostModel(profile, micro_batch=16, num_micro_batches=1)
    # client dev0 (index 0), cut [2, 5), on helper dev2 over its 2 MB/s link
    up = 16 * profile.layers[1].boundary_bytes_per_sample / 2e6
    down = 16 * profile.layers[4].boundary_bytes_per_sample / 2e6
    assert times.r_s[0][0] == pytest.approx(cost.forward_time(0, 0, 2, 16) + up)
    assert times.p_s[0][0] == pytest.approx(cost.forward_time(2, 2, 5, 16))
    assert times.l_s[0][0] == pytest.approx(down + cost.forward_time(0, 5, 6, 16))
    assert times.l_prime_s[0][0] == pytest.approx(cost.backward_time(0, 5, 6, 16) + down)
    assert times.p_prime_s[0][0] == pytest.approx(cost.backward_time(2, 2, 5, 16))
    assert times.r_prime_s[0][0] == pytest.approx(up + cost.backward_time(0, 0, 2, 16))
    assert times.demand_bytes == [cost.memory(2, 5, 16, 1), cost.memory(1, 4, 16, 1)]
    assert times.capacity_bytes == [profile.devices[2].memory_bytes]
    # dev1 has its own cut and the default bandwidth
    assert times.p_s[0][1] == pytest.approx(cost.forward_time(2, 1, 4, 16))


@pytest.mark.parametrize("cuts,match", [([[2, 6], [1, 4]], r"cuts\.0: client 'dev0': cut \[2, 6\] .*< 6"),
                                        ([[2, 5], [4, 9]], r"cuts\.1: client 'dev1'")])
def test_bad_cuts_name_the_client(cuts, match):
    with pytest.raises(BadInput, match=match):
        pair_times(make_profile(layers=6), request(cuts=cuts))


def test_unknown_device_is_bad_input():
    with pytest.raises(BadInput, match=r"helpers\.0: device 'nope' is not in the profile"):
        pair_times(make_profile(layers=6), request(helpers=["nope"]))


def test_a_client_that_cannot_hold_parts_1_and_3_is_infeasible():
    profile = make_profile(layers=6, memory_gb=(0.000001, 4, 4))
    with pytest.raises(Infeasible, match=r"clients\.0: client 'dev0' needs .* for parts 1 and 3"):
        pair_times(profile, request())


def test_request_refuses_unordered_cuts():
    with pytest.raises(ValueError, match=r"cuts\.0[\s\S]*σ1 must be below σ2"):
        request(cuts=[[3, 3], [1, 4]])


def test_request_refuses_a_device_in_both_roles():
    with pytest.raises(ValueError, match="both client and helper"):
        request(helpers=["dev0"])
