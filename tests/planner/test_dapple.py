"""DAPPLE's partition DP at one micro-batch per round (issue 24 item 5)."""

import pytest

from hppctl.planner.cost import CostModel, StageChoice
from hppctl.planner.strategies.dapple import dapple_partition
from hppctl.planner.strategies.homogeneous import HomogeneousView
from tests.conftest import make_profile


@pytest.mark.parametrize("m", [1, 2, 8])
def test_partition_covers_every_layer_and_device_at_any_m(m):
    # at m = 1 the fill term was 0 * inf = NaN on unreachable prefixes; argmin picked it and the
    # trace-back returned a stage (-1, L) on no devices
    profile = make_profile(layers=9, speeds=(1, 1, 1, 1))
    view = HomogeneousView(CostModel(profile, micro_batch=32, num_micro_batches=m))
    stages = dapple_partition(view, m)
    assert stages[0][0] == 0 and stages[-1][1] == 9
    assert all(a[1] == b[0] for a, b in zip(stages, stages[1:]))
    assert all(start < end and replicas >= 1 for start, end, replicas in stages)
    assert sum(replicas for _, _, replicas in stages) == 4


def test_evaluation_names_a_stage_without_devices():
    cm = CostModel(make_profile(layers=4, speeds=(1, 1)), micro_batch=8, num_micro_batches=1)
    with pytest.raises(ValueError, match="stage without devices"):
        cm.evaluate([StageChoice(0, 4, (), ())])
