"""Accelerators and precision, on a machine without CUDA (runtime/accelerator.py, docs/runtime.md
"Accelerators and precision").

What runs here: `resolve` for cpu, auto and an absent cuda; the gloo staging pair on the CPU (the
identity) and onto another device (`meta`); the precision objects; the device parameter threaded
through the one training-state factory to the stage, the optimizer and the executor (a CPU run in
process equal to the single-process reference, and a `meta` stage for shapes); cluster-file and flag
refusals (exit 2, one line). The gloo runs (explicit `accelerator: cpu` bit-identical to the
default, bf16 close to fp32) are in test_accelerator_runs.py. No CUDA path is exercised: this
machine has no GPU.
"""

from __future__ import annotations

import pytest
import torch

from hppctl.models.cluster import ClusterSpec, DeviceSpec
from hppctl.runtime import accelerator
from hppctl.runtime.accelerator import AcceleratorUnavailable, Precision, from_wire, resolve, to_wire
from hppctl.runtime.config import TrainOptions, WorkerConfig
from hppctl.runtime.stage import initial_stage_tensors
from hppctl.runtime.topology import Topology
from hppctl.runtime.training_state import build_training_state
from hppctl.schedule import schedule_for_plan
from hppctl.store import save
from tests.runtime.factories import local_cluster, make_plan
from tests.runtime.reference import train_reference

ONE_STAGE = [((0, 5), ["a"], [4])]
TWO_STAGES = [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])]


# --- resolve --------------------------------------------------------------------------------------

def test_cpu_resolves_to_the_cpu():
    assert resolve("cpu") == torch.device("cpu")


def test_auto_is_the_cpu_without_cuda_and_cuda_with_it():
    assert resolve("auto", cuda_available=lambda: False) == torch.device("cpu")
    assert resolve("auto", cuda_available=lambda: True) == torch.device("cuda", 0)
    assert resolve("auto") == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_absent_is_one_line_naming_the_device():
    with pytest.raises(AcceleratorUnavailable) as e:
        resolve("cuda", device_name="nano0")
    message = str(e.value)
    assert "\n" not in message and "nano0" in message and "accelerator: cuda" in message
    assert "torch.cuda.is_available() is False" in message


def test_an_unknown_accelerator_is_refused():
    with pytest.raises(accelerator.BadInput, match="'tpu' is not one of cpu, cuda, auto"):
        resolve("tpu", device_name="x")


# --- the wire pair --------------------------------------------------------------------------------

def test_the_wire_pair_is_the_identity_on_the_cpu():
    t = torch.randn(3, 4)
    assert to_wire(t) is t and from_wire(t, torch.device("cpu")) is t
    assert to_wire(t, torch.float32) is t


def test_receive_buffers_are_page_locked_for_cuda_only():
    assert accelerator.pinned_for(torch.device("cpu")) is False
    assert accelerator.pinned_for(torch.device("cuda", 0)) is True  # not allocated here: no CUDA


def test_to_wire_casts_to_the_receivers_type_in_host_memory():
    t = torch.randn(3, 4).to(torch.bfloat16)
    wire = to_wire(t, torch.float32)
    assert wire.dtype == torch.float32 and wire.device.type == "cpu"
    torch.testing.assert_close(wire, t.float())


def test_from_wire_moves_onto_the_compute_device():
    moved = from_wire(torch.randn(2, 5), torch.device("meta"))
    assert moved.device.type == "meta" and moved.shape == (2, 5)


# --- precision ------------------------------------------------------------------------------------

def test_fp32_runs_without_autocast_and_without_a_scale():
    p = Precision("fp32", "cpu")
    with p.autocast():
        assert not torch.is_autocast_enabled("cpu")
    loss = torch.tensor(2.0)
    assert p.scale(loss) is loss and p.loss_scale == 1.0


def test_bf16_autocasts_a_linear_layer_on_the_cpu():
    layer = torch.nn.Linear(4, 3)
    with Precision("bf16", "cpu").autocast():
        out = layer(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16 and layer.weight.dtype == torch.float32


def test_fp16_scales_the_loss_and_unscales_gradients_by_one_shared_scale():
    p = Precision("fp16", "cpu")
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    p.scale((w * w).sum()).backward()
    torch.testing.assert_close(w.grad, torch.tensor([2.0, 4.0]) * accelerator.FP16_LOSS_SCALE)
    assert p.unscale([w]) is True
    torch.testing.assert_close(w.grad, torch.tensor([2.0, 4.0]))


def test_an_overflowed_fp16_gradient_skips_the_step():
    w = torch.nn.Parameter(torch.ones(2))
    w.grad = torch.tensor([1.0, float("inf")])
    assert Precision("fp16", "cpu").unscale([w]) is False


def test_precision_checks_what_torch_can_autocast_here():
    accelerator.check_precision("bf16", torch.device("cpu"))
    accelerator.check_precision("fp16", torch.device("cpu"))  # torch >= 2.3 autocasts fp16 on the CPU
    with pytest.raises(accelerator.BadInput, match="--precision: 'fp8'"):
        accelerator.check_precision("fp8", torch.device("cpu"))


def test_cpu_describes_itself_without_gpu_figures():
    cpu = torch.device("cpu")
    assert accelerator.describe(cpu) == {"type": "cpu", "name": None, "memory_bytes": None, "integrated": None}
    accelerator.synchronize(cpu)
    assert accelerator.peak_memory_bytes(cpu) is None


# --- the device parameter through the training-state factory ---------------------------------------

def worker_config(plan, device: str, **options) -> WorkerConfig:
    return WorkerConfig(device=device, store_host="127.0.0.1", store_port=1, model=plan.model,
                        granularity=plan.granularity, schedule=schedule_for_plan(plan),
                        options=TrainOptions(dataset="synthetic", threads=1, **options))


def test_the_factory_puts_stage_and_optimizer_state_on_the_given_device():
    plan = make_plan("tiny-mlp", TWO_STAGES, global_batch=8, micro_batch=4)
    config = worker_config(plan, "b")
    tensors = initial_stage_tensors("tiny-mlp", "fine", [(0, 2), (2, 5)], seed=0)[1]
    state = build_training_state(config, config.schedule, 1, tensors, device=torch.device("meta"))
    assert state.device == torch.device("meta") and state.stage.device == torch.device("meta")
    assert {p.device.type for p in state.stage.parameters()} == {"meta"}
    assert all(p.device.type == "meta" for g in state.optimizer.param_groups for p in g["params"])
    executor = state.executor_class("b", config.schedule.actions["b"], Topology.of(config.schedule), state.stage,
                                    state.optimizer, None, state.feed)
    assert executor.accelerator == torch.device("meta") and executor.precision == Precision("fp32", "meta")
    # shapes only: the stage runs on meta inputs and gives its output specs' shapes
    inputs = [torch.empty((4, *s.shape), dtype=s.dtype, device="meta") for s in state.stage.inputs]
    outputs = state.stage(*inputs)
    assert [tuple(o.shape[1:]) for o in outputs] == [s.shape for s in state.stage.outputs]


def test_the_factory_resolves_the_configs_accelerator():
    plan = make_plan("tiny-mlp", ONE_STAGE, global_batch=8, micro_batch=4)
    config = worker_config(plan, "a").model_copy(update={"accelerator": "auto"})
    tensors = initial_stage_tensors("tiny-mlp", "fine", [(0, 5)], seed=0)[0]
    state = build_training_state(config, config.schedule, 0, tensors)
    assert state.device == resolve("auto")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_cpu_device_trains_through_the_factory_and_executor(precision, one_torch_thread):
    """One device, one stage, in process (no transfers): the device parameter and the precision
    go through build_training_state and the executor; fp32 equals the plain loop exactly as the gloo
    equivalence tests do, bf16 within its rounding."""
    plan = make_plan("tiny-mlp", ONE_STAGE, global_batch=8, micro_batch=4)
    config = worker_config(plan, "a", rounds=3, lr=0.1, precision=precision)
    tensors = initial_stage_tensors("tiny-mlp", "fine", [(0, 5)], seed=0)[0]
    state = build_training_state(config, config.schedule, 0, tensors, device=torch.device("cpu"))
    executor = state.executor_class("a", config.schedule.actions["a"], Topology.of(config.schedule), state.stage,
                                    state.optimizer, None, state.feed)
    assert executor.precision == Precision(precision, "cpu")
    for r in range(3):
        executor.run_round(r)
    expected = train_reference(plan, config.options)
    tolerance = {"fp32": {"rtol": 1e-4, "atol": 1e-6}, "bf16": {"rtol": 0.05, "atol": 0.02}}[precision]
    for name, value in state.stage.state_dict().items():
        torch.testing.assert_close(value, expected[name], **tolerance, msg=lambda m: f"{name}: {m}")
    if precision == "bf16":
        assert any(not torch.equal(v, expected[k]) for k, v in state.stage.state_dict().items())


# --- refusals: exit 2, one line, no worker ----------------------------------------------------------

@pytest.fixture
def files(tmp_path):
    def write(cluster):
        plan = make_plan("tiny-mlp", TWO_STAGES, global_batch=8, micro_batch=4)
        save(tmp_path / "plan.yaml", plan)
        save(tmp_path / "cluster.yaml", cluster)
        return tmp_path / "plan.yaml", tmp_path / "cluster.yaml"
    return write


def test_a_bad_accelerator_value_names_file_field_and_value(cli, files, tmp_path):
    plan, cluster = files(local_cluster("a", "b"))
    cluster.write_text("name: x\ndevices:\n  - {name: a, local: true, accelerator: tpu}\n  - {name: b, local: true}\n")
    code, out, err = cli("run", "--plan", plan, "--cluster", cluster, "--rounds", "1")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"error: {cluster}: devices.0.accelerator: ")
    assert "'tpu'" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_local_cuda_device_without_cuda_is_refused_before_any_worker(cli, files):
    inventory = ClusterSpec(name="x", devices=[DeviceSpec(name="a", local=True),
                                               DeviceSpec(name="b", local=True, accelerator="cuda")])
    plan, cluster = files(inventory)
    code, out, err = cli("run", "--plan", plan, "--cluster", cluster, "--rounds", "1")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"error: {cluster}: devices.1.accelerator: 'cuda' for local device b")
    assert "workers" not in err


def test_an_unknown_precision_is_refused(cli, files):
    plan, cluster = files(local_cluster("a", "b"))
    code, out, err = cli("run", "--plan", plan, "--cluster", cluster, "--precision", "fp8")
    assert code == 2 and err == "error: --precision: unknown value 'fp8' (fp32, fp16, bf16)\n"


@pytest.mark.parametrize("argv, flag", [(("psl", "run"), None), (("run",), "--precision")])
def test_psl_plans_refuse_cuda_devices_and_precision_rather_than_ignore_them(cli, tmp_path, argv, flag):
    """PSL workers compute on the CPU only: `accelerator: cuda` and `--precision bf16` are refused."""
    from tests.psl.test_runtime import CLIENTS, HELPERS, tiny_plan

    save(tmp_path / "plan.yaml", tiny_plan())
    devices = [*CLIENTS, *HELPERS]
    cuda = flag is None
    (tmp_path / "c.yaml").write_text("name: x\ndevices:\n" + "".join(
        f"  - {{name: {d}, local: true{', accelerator: cuda' if cuda and i == 1 else ''}}}\n"
        for i, d in enumerate(devices)))
    extra = ["--precision", "bf16"] if flag else []
    code, out, err = cli(*argv, "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "c.yaml", *extra)
    assert code == 2 and out == "" and err.count("\n") == 1
    if cuda:
        assert err.startswith(f"error: {tmp_path / 'c.yaml'}: devices.1.accelerator: 'cuda' for device {devices[1]}: "
                              f"psl plans compute on the CPU only")
    else:
        assert err.startswith("error: --precision: not supported for psl plans")


def test_optimizer_state_restored_after_a_replan_follows_the_stage_onto_its_device():
    """A fault-tolerant re-plan rebuilds the stage on the worker's device from a stage state that may
    have arrived in host memory (a backup); its optimizer state must follow the parameters (`step`
    stays where torch keeps it)."""
    from hppctl.runtime.replication import restore_optimizer, stage_state
    from hppctl.runtime.stage import Stage

    cpu_stage = Stage("tiny-mlp", "fine", 0, 2)
    optimizer = torch.optim.Adam(cpu_stage.parameters(), lr=0.01)
    cpu_stage(torch.randn(4, *cpu_stage.inputs[0].shape))[0].sum().backward()
    optimizer.step()
    state = stage_state(cpu_stage, optimizer)
    meta_stage = Stage("tiny-mlp", "fine", 0, 2, tensors=state["tensors"], device=torch.device("meta"))
    meta_optimizer = torch.optim.Adam(meta_stage.parameters(), lr=0.01)
    restore_optimizer(meta_optimizer, meta_stage, state["optim"])
    entries = [meta_optimizer.state[p] for p in meta_stage.parameters()]
    assert entries and all(e["exp_avg"].device.type == "meta" and e["step"].device.type == "cpu" for e in entries)


def test_a_round_seeds_the_generators_it_draws_from_without_formatting_stack_traces(monkeypatch):
    """torch.manual_seed also queued a seeding of every CUDA, XPU and MTIA device, formatting a stack
    trace for each (none is initialised on a CPU worker), every round; the draws stay the same."""
    import traceback
    from types import SimpleNamespace

    from hppctl.runtime.worker import Worker

    torch.manual_seed(5)
    expected = torch.rand(4)
    accelerator.seed_generators(5, torch.device("cpu"))
    assert torch.equal(torch.rand(4), expected)

    def no_stack(*args, **kwargs):
        raise AssertionError("a stack trace was formatted")

    monkeypatch.setattr(traceback, "format_stack", no_stack)
    worker = SimpleNamespace(config=SimpleNamespace(options=TrainOptions(rounds=1)), rank=0, optimizer=torch.optim.SGD(
        [torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    drawn = []
    executor = SimpleNamespace(accelerator=torch.device("cpu"), run_round=lambda r: drawn.append(torch.rand(4)) or
                               SimpleNamespace(cpu_s=0.0))
    Worker.run_round(worker, executor, 0)
    Worker.run_round(worker, executor, 0)
    assert torch.equal(drawn[0], drawn[1])  # seeded the same for the same round and rank
