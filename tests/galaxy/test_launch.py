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


def result_of(plan, overlap: bool, length: int):
    """A finished run's result as the launcher builds it, with one pass per device."""
    import torch

    from hppctl.runtime.galaxy.launch import InferenceResult, block_overlap, collective

    cluster = ClusterSpec.model_validate({"name": "t", "devices": [{"name": n, "local": True} for n in plan.devices()]})
    req = InferenceRequest(plan, cluster, overlap=overlap)
    one_pass = {k: 0.1 for k in ("latency_s", "layers_s", "compute_s", "exposed_comm_s", "cpu_s")}
    reports = {d: {"host": "localhost", "threads": 1, "peak_rss_bytes": 0, "passes": [{**one_pass, "bytes_sent": 1}]}
               for d in plan.devices()}
    return InferenceResult(torch.zeros(length, plan.hidden), reports, 1.0, plan, any(block_overlap(req)), 0.0,
                           "float32", block_overlap(req), collective(req))


def test_the_run_summary_lists_the_rows_each_device_ran():
    """Megatron's forward runs every row on every device; galaxy's rings (--no-overlap on the same plan)
    run the equal split of the request's length, whatever rows the plan lists."""
    profile = make_inference_profile(speeds=(1, 1, 1), bandwidth=1e6 * 20, allreduce_cpu=4e-10, **LAB_HOST)
    galaxy = make_inference_plan(profile, "galaxy")
    assert galaxy.collective == "all-reduce"
    rows = lambda result: [s["rows"] for s in result.summary()["shares"]]  # noqa: E731
    assert rows(result_of(galaxy, True, 64)) == [64, 64, 64]
    assert rows(result_of(galaxy, False, 64)) == [22, 21, 21]
    assert rows(result_of(make_inference_plan(profile, "megatron"), True, 10)) == [10, 10, 10]
