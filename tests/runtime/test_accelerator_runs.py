"""Tier 2 (gloo): accelerators and precision through real `hppctl run` workers, on the CPU.

- A cluster file that says `accelerator: cpu` for every device trains exactly (torch.equal) what
  the same file without the field trains: the accelerator plumbing (to_wire/from_wire, the bound
  executor, fp32 without autocast) changes nothing on the CPU.
- `--precision bf16` and `fp16` on two stages (CPU autocast: real bf16/fp16 kernels) learn, and end
  within 5 % (relative norm, per tensor) of the fp32 run's parameters; measured on this machine
  2026-11-26 with 30 rounds of digits (`python bench/gpu_smoke.py`): bf16 1.96 %, fp16 2.23 %.

What these do not show: anything on CUDA (this machine has none; bench/gpu_smoke.py is the check).
"""

from __future__ import annotations

import pytest
import torch

from hppctl.models.cluster import ClusterSpec, DeviceSpec
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.session import RunRequest, Session
from tests.runtime.factories import local_cluster, make_plan

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]

TAIL_REPLICATED = [((0, 2), ["a"], [8]), ((2, 5), ["b", "c"], [4, 4])]
TWO_STAGES = [((0, 2), ["a"], [8]), ((2, 5), ["b"], [8])]
PRECISION_ROUNDS = 30
RELATIVE_TOLERANCE = 0.05


def train(plan, cluster, **options):
    opts = TrainOptions(threads=1, **options)
    return Session(RunRequest(plan, cluster, opts)).run()


def test_explicit_cpu_accelerator_trains_bit_identically_to_the_default():
    plan = make_plan("tiny-mlp", TAIL_REPLICATED, global_batch=16, micro_batch=8)
    explicit = ClusterSpec(name="local", devices=[DeviceSpec(name=n, local=True, accelerator="cpu")
                                                  for n in plan.devices()])
    default = train(plan, local_cluster(*plan.devices()), rounds=5, dataset="digits", lr=0.1)
    chosen = train(plan, explicit, rounds=5, dataset="digits", lr=0.1)
    expected, actual = default.model_state(), chosen.model_state()
    assert sorted(actual) == sorted(expected)
    assert all(torch.equal(actual[k], expected[k]) for k in expected)
    assert [r["loss"] for r in chosen.rounds] == [r["loss"] for r in default.rounds]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_worker_resolves_its_accelerator_on_the_device_and_fails_naming_it():
    """What a `host:` device without CUDA does (the CLI refuses a local one before starting): the
    worker resolves `accelerator: cuda` where it runs and fails the run with one line naming it."""
    from hppctl.runtime.launcher import WorkerFailed

    plan = make_plan("tiny-mlp", TWO_STAGES, global_batch=16, micro_batch=8)
    cluster = ClusterSpec(name="local", devices=[DeviceSpec(name="a", local=True),
                                                 DeviceSpec(name="b", local=True, accelerator="cuda")])
    with pytest.raises(WorkerFailed) as failure:
        train(plan, cluster, rounds=1, dataset="digits", lr=0.1)
    message = str(failure.value)
    assert "b" in message and "accelerator: cuda" in message and "torch.cuda.is_available() is False" in message


@pytest.fixture(scope="module")
def fp32_run():
    plan = make_plan("tiny-mlp", TWO_STAGES, global_batch=32, micro_batch=8)
    return plan, train(plan, local_cluster("a", "b"), rounds=PRECISION_ROUNDS, dataset="digits", lr=0.1)


def relative_differences(actual: dict, expected: dict) -> dict[str, float]:
    return {k: float((actual[k] - expected[k]).norm() / expected[k].norm()) for k in expected
            if expected[k].is_floating_point()}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_on_two_stages_learns_and_stays_close_to_fp32(fp32_run, precision):
    plan, reference = fp32_run
    run = train(plan, local_cluster("a", "b"), rounds=PRECISION_ROUNDS, dataset="digits", lr=0.1, precision=precision)
    losses = [r["loss"] for r in run.rounds]
    assert sum(losses[-3:]) < 0.6 * sum(losses[:3]), losses
    state, expected = run.model_state(), reference.model_state()
    differences = relative_differences(state, expected)
    assert max(differences.values()) < RELATIVE_TOLERANCE, differences
    assert max(differences.values()) > 0, "autocast did nothing: the run equals fp32 exactly"


# --- Galaxy inference -------------------------------------------------------------------------------

def test_inference_under_half_precision_stays_close_to_the_model():
    """run_device with the CPU device and bf16/fp16 autocast on 3 gloo ranks: every strategy within
    half-precision rounding of the Hugging Face forward (measured: bf16 <= 6.9e-3, fp16 <= 7.1e-4 max
    abs), and away from the same strategy's fp32 output (bf16 >= 5e-4, fp16 >= 8e-5; fp32 is within
    6e-7 of the model): autocast really ran."""
    from hppctl.planner.galaxy import split_rows
    from hppctl.runtime.galaxy.weights import extract
    from tests.galaxy.factories import hf_model
    from tests.galaxy.spawned import run_cases

    model = hf_model("gpt2", seed=7)
    ids = torch.randint(0, 100, (11,), generator=torch.Generator().manual_seed(7))
    weights = extract(model, "gpt2")
    with torch.no_grad():
        expected = model(input_ids=ids[None]).last_hidden_state[0]
    rows = split_rows(11, 3)
    strategies = (("galaxy", True), ("galaxy", False), ("sp", False))
    cases = [(s, o, weights, [2, 1, 1], [64, 40, 24], rows, ids, "float32", precision)
             for precision in ("fp32", "bf16", "fp16") for s, o in strategies]
    outputs = run_cases(3, cases)
    fp32 = outputs[:len(strategies)]
    for n, (case, got) in enumerate(zip(cases, outputs)):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2, msg=lambda m: f"{case[0]} {case[-1]}: {m}")
        if case[-1] != "fp32":  # autocast really ran: far from the fp32 pass (which is within 1e-6 of the model)
            assert float((got - fp32[n % len(strategies)]).abs().max()) > 1e-5, case


def test_an_inference_run_honours_accelerator_and_precision(tmp_path, cli):
    """`hppctl run` on a galaxy plan: the workers resolve `accelerator: cpu` and autocast in bf16."""
    from hppctl.store import save
    from tests.galaxy.factories import hf_model, make_inference_profile

    model = hf_model("gpt2", seed=3)
    model.save_pretrained(tmp_path / "ckpt")
    profile = make_inference_profile(speeds=(2, 1), heads=4, hidden=32, intermediate=128, layers=2,
                                     model=f"hf:{tmp_path / 'ckpt'}", names=["a", "b"])
    save(tmp_path / "prof.json", profile)
    (tmp_path / "c.yaml").write_text("name: loc2\ndevices:\n  - {name: a, local: true, memory: 1GB, accelerator: cpu}\n"
                                     "  - {name: b, local: true, memory: 1GB, accelerator: auto}\n")
    code, _, err = cli("plan", "--profile", tmp_path / "prof.json", "--strategy", "galaxy", "--seq-len", 64,
                       "--out", tmp_path / "g.yaml")
    assert code == 0, err
    ids = torch.randint(0, 100, (13,), generator=torch.Generator().manual_seed(5))
    (tmp_path / "ids.json").write_text(str(ids.tolist()))
    outputs = {}
    for precision in ("fp32", "bf16"):
        code, _, err = cli("run", "--plan", tmp_path / "g.yaml", "--cluster", tmp_path / "c.yaml", "--input-ids",
                           tmp_path / "ids.json", "--output", tmp_path / f"{precision}.pt", "--precision", precision)
        assert code == 0, err
        outputs[precision] = torch.load(tmp_path / f"{precision}.pt")
    with torch.no_grad():
        expected = model(input_ids=ids[None]).last_hidden_state[0]
    torch.testing.assert_close(outputs["fp32"], expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(outputs["bf16"], expected, atol=2e-2, rtol=2e-2)
    assert not torch.equal(outputs["bf16"], outputs["fp32"])


# --- every executor kind under fp16 (the loss scale path) -------------------------------------------

def bipartition_run():
    from tests.bipartition.factories import bi_plan

    return bi_plan("tiny-mlp", [0, 3, 4, 5], [0, 2, 5, 5], ["a", "b", "c"], global_batch=16, micro_batch=4), None


def async_run(policy: str):
    from hppctl.runtime.async_exec.plans import epoch_schedule

    plan = make_plan("tiny-mlp", [((0, 2), ["a"], [128]), ((2, 5), ["b"], [128])], global_batch=256, micro_batch=128)
    return plan, epoch_schedule(plan, policy, "synthetic")


@pytest.mark.parametrize("kind", ["bipartition", "nf1b", "pipedream"])
def test_fp16_on_every_executor_kind_stays_close_to_fp32(kind):
    """Bi-Partition (loss at whichever worker backwards the last layer, recomputed split layers) and
    the asynchronous executors under fp16 autocast with the shared loss scale: close to their own
    fp32 run, and not equal to it (measured 2026-11-26: bipartition 3.0e-5, nf1b 9.6e-4, pipedream
    8.1e-4 relative norm; fp32 runs repeat exactly)."""
    plan, schedule = bipartition_run() if kind == "bipartition" else async_run(kind)
    states = {}
    for precision in ("fp32", "fp16"):
        opts = TrainOptions(threads=1, rounds=2, dataset="synthetic", lr=0.05, precision=precision)
        states[precision] = Session(RunRequest(plan, local_cluster(*plan.devices()), opts, schedule=schedule)).run() \
            .model_state()
    differences = relative_differences(states["fp16"], states["fp32"])
    assert 0 < max(differences.values()) < RELATIVE_TOLERANCE, differences


def test_hppctl_run_takes_precision_and_says_so(cli, tmp_path):
    from hppctl.store import save

    plan = make_plan("tiny-mlp", TWO_STAGES, global_batch=16, micro_batch=8)
    save(tmp_path / "plan.yaml", plan)
    (tmp_path / "c.yaml").write_text("name: x\ndevices:\n  - {name: a, local: true, accelerator: auto}\n"
                                     "  - {name: b, local: true, accelerator: cpu}\n")
    code, out, err = cli("run", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "c.yaml", "--rounds", 2,
                         "--precision", "bf16", "--save-model", tmp_path / "m.pt", "--json")
    assert code == 0, err
    assert err.splitlines()[0] == "precision bf16: forward passes under torch.autocast on each device's accelerator"
    assert torch.load(tmp_path / "m.pt")
