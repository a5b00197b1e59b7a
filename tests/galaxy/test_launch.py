"""Tier 1: what the inference launcher tells each worker, derived from the plan alone (no processes)."""

from __future__ import annotations

from hppctl.models.cluster import ClusterSpec
from hppctl.planner.galaxy import make_inference_plan
from hppctl.runtime.galaxy.hmp import runs_megatron
from hppctl.runtime.galaxy.launch import InferenceRequest, worker_config
from tests.galaxy.factories import make_inference_profile

LAB_HOST = dict(cpu_cores=0.084, threads=1, comm_cpu=2e-9)


def configs(plan, overlap: bool = True, length: int = 64) -> list[dict]:
    cluster = ClusterSpec.model_validate({"name": "t", "devices": [{"name": n, "local": True} for n in plan.devices()]})
    req = InferenceRequest(plan, cluster, overlap=overlap, repeats=3, wire_dtype="float16")
    return [worker_config(req, d, length, "127.0.0.1", 29500).model_dump() for d in plan.devices()]


def test_galaxy_on_megatrons_layout_runs_megatrons_program_on_every_device():
    """Issue 28: galaxy is never slower than Megatron where their layouts coincide. There every worker
    is told exactly what megatron's is (rank, shares, collective, no overlap, wire dtype, budget), the
    strategy's name aside, and both names select Megatron's forward and no output gather."""
    profile = make_inference_profile(speeds=(1, 1, 1), bandwidth=1e6 * 20, allreduce_cpu=4e-10, **LAB_HOST)
    galaxy, megatron = make_inference_plan(profile, "galaxy"), make_inference_plan(profile, "megatron")
    assert [(s.device, s.heads, s.columns) for s in galaxy.shares] == \
           [(s.device, s.heads, s.columns) for s in megatron.shares]
    g, m = configs(galaxy), configs(megatron)
    assert [{**c, "strategy": None} for c in g] == [{**c, "strategy": None} for c in m]
    assert all(runs_megatron(c["strategy"], c["collective"]) for c in g + m)
    # --no-overlap is the ablation on galaxy's own rings, not Megatron's program
    assert not any(runs_megatron(c["strategy"], c["collective"]) for c in configs(galaxy, overlap=False))
