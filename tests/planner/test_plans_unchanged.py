"""The planner's answers are those recorded before its speed-up (issue 28 item 4), to the last bit.

tests/planner/plans_before_scale.json holds, for every planner-test instance and 40 seeded medium
ones (tests/planner/plan_fixture.py rebuilds them), each strategy's stages, devices, samples, round
latency (`float.hex`) and dominant step, recorded on the code before the speed-up. Any change to
the DP, Algorithm 1's vectorised twin, the cost model's tables or the profile loading that moves a
single plan or the last bit of an objective fails here.
"""

import json

import pytest

from tests.planner.plan_fixture import FIXTURE, instances, plans_of

RECORDED = json.loads(FIXTURE.read_text())["instances"]
INSTANCES = instances()


def test_fixture_covers_every_instance():
    assert sorted(RECORDED) == sorted(i.name for i in INSTANCES)


@pytest.mark.parametrize("instance", INSTANCES, ids=lambda i: i.name)
def test_plans_equal_the_recorded_ones(instance):
    assert plans_of(instance) == RECORDED[instance.name]
