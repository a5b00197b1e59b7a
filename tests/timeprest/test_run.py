"""Tier 2 (gloo): nf1b and pipedream through `hppctl run`'s launcher (Session, local worker processes):
one round per epoch, a per-stage checkpoint after every epoch, and the final weights equal the
single-process reference of the same window."""

from __future__ import annotations

import pytest
import torch

from hppctl.errors import BadInput
from hppctl.runtime.async_exec.plans import epoch_schedule
from hppctl.runtime.checkpoint import CheckpointDir
from hppctl.runtime.config import TrainOptions
from hppctl.planner.manual import manual_plan
from hppctl.runtime.session import RunRequest, Session
from tests.runtime.factories import local_cluster
from tests.timeprest.reference import train_async_reference

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]


def _plan(micro_batch: int = 128):
    # tiny-mlp (5 fine layers) in 3 one-device stages; synthetic has 2048 samples: 8 mini-batches of 256.
    return manual_plan("tiny-mlp", [((0, 2), ["a"], [micro_batch]), ((2, 4), ["b"], [micro_batch]), ((4, 5), ["c"], [micro_batch])],
                       global_batch=256, micro_batch=micro_batch)


@pytest.mark.parametrize("policy", ["nf1b", "pipedream"])
def test_run_checkpoints_every_epoch_and_equals_reference(policy, tmp_path):
    plan = _plan()
    schedule = epoch_schedule(plan, policy, "synthetic")
    assert schedule.num_micro_batches // schedule.micro_batches_per_update == 8
    options = TrainOptions(dataset="synthetic", rounds=2, lr=0.05, threads=1, checkpoint_every=1, seed=1)
    result = Session(RunRequest(plan, local_cluster(*plan.devices()), options, checkpoint_dir=tmp_path,
                                schedule=schedule)).run()
    assert [row["round"] for row in result.rounds] == [0, 1]
    assert CheckpointDir(tmp_path).complete_rounds() == [1, 2]  # after epoch 1 and at the end
    assert sorted(p.name for p in (tmp_path / "round-00000001").iterdir()) == ["COMPLETE.json", "stage-0.pt",
                                                                               "stage-1.pt", "stage-2.pt"]
    expected = train_async_reference("tiny-mlp", schedule, options, epochs=2)
    actual = result.model_state()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=1e-4, atol=1e-6, msg=lambda m: f"{key}: {m}")


def test_async_schedule_needs_one_device_per_stage():
    plan = manual_plan("tiny-mlp", [((0, 2), ["a", "b"], [64, 64]), ((2, 5), ["c"], [128])], global_batch=256,
                       micro_batch=128)
    with pytest.raises(BadInput, match="one device per stage"):
        epoch_schedule(plan, "nf1b", "synthetic")
