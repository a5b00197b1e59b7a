"""`hppctl profile` and accelerators, on a machine without CUDA.

- the identify probe resolves `accelerator:` on the device and records it (a CPU here; `cuda`
  absent: the probe fails with one error record naming CUDA, which the orchestrator reports as the
  device's failure);
- the train probe with an explicit `accelerator` measures through the same functions (the CPU
  path: the clock, the RSS peak, the records are what they were);
- the memory budget of a CUDA device is its GPU memory, and with unified memory (Jetson)
  min(GPU-visible, host budget); a GPU changes the device fingerprint, a CPU's stays the same;
- the profile table names the GPU.

The CUDA measurement itself (synchronized clocks, the allocator's peak) is not run here: no GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from hppctl.models.profile import AcceleratorProfile, DeviceProfile
from hppctl.profiling import device as device_probe
from hppctl.profiling import parse, train_probe
from hppctl.profiling.records import AcceleratorRecord, Identity

GiB = 2**30


def identity(**accelerator) -> Identity:
    record = {"type": "identity", "hostname": "nano0", "machine": "aarch64", "cpu_model": "ARMv8", "cpus": 4,
              "cpu_quota_cores": None, "cpu_quota_source": "none", "threads": 4, "threads_source": "quota",
              "memory_total_bytes": 8 * GiB, "memory_available_bytes": 6 * GiB, "memory_limit_bytes": None,
              "memory_limit_source": "none", "omp_num_threads": None, "python": "3.11", "torch": "2.13.0",
              "transformers": None, "hppctl": "0", "kernel": "5.10"}
    if accelerator:
        record["accelerator"] = accelerator
    return parse.typed(record, Identity)


def test_identify_records_the_resolved_accelerator():
    record = device_probe.identify(measure_quota=False, accelerator="auto")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert record["accelerator"]["requested"] == "auto" and record["accelerator"]["type"] == expected
    assert parse.typed(record, Identity).accelerator == AcceleratorRecord(**record["accelerator"])
    assert device_probe.identify(measure_quota=False)["accelerator"] == {
        "requested": "cpu", "type": "cpu", "name": None, "memory_bytes": None, "integrated": None}


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_the_identify_probe_fails_in_one_record_when_cuda_is_absent():
    done = subprocess.run([sys.executable, "-m", "hppctl.profiling.probe", "identify", "--args",
                           json.dumps({"accelerator": "cuda", "measure_quota": False})],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["type"] for r in records] == ["error"]
    assert "accelerator: cuda" in records[0]["error"] and "torch.cuda.is_available() is False" in records[0]["error"]


def test_the_train_probe_with_an_explicit_cpu_accelerator_measures_as_before(one_torch_thread):
    records = list(train_probe.measure({"model": "tiny-mlp", "granularity": "fine", "batch_sizes": [2],
                                        "threads": 1, "repeats": 1, "warmup": 0, "window_s": 0.01,
                                        "accelerator": "cpu"}))
    setup = next(r for r in records if r["type"] == "setup")
    memory = next(r for r in records if r["type"] == "memory")
    passes = [r for r in records if r["type"] == "pass"]
    assert setup["clock"] == "cpu" and memory["peak_method"] != "torch.cuda.max_memory_allocated"
    assert len(passes) == 1 and len(passes[0]["forward"]) == setup["layers"]
    m = train_probe.Measurement("tiny-mlp", "fine", 1, accelerator="auto")
    assert m.device == torch.device("cpu") and m.model_resident == m.model_rss  # no CUDA: the CPU path


def test_a_discrete_gpus_budget_is_its_memory():
    gpu = identity(requested="cuda", type="cuda", name="RTX A2000", memory_bytes=12 * GiB, integrated=False)
    budget, source, measured = parse.memory_budget(gpu, runtime_bytes=GiB, inventory_bytes=None)
    assert budget == 12 * GiB and measured == 12 * GiB and "CUDA memory of RTX A2000" in source


def test_unified_memory_counts_the_smaller_of_gpu_visible_and_host_budget():
    jetson = identity(requested="auto", type="cuda", name="Orin", memory_bytes=7 * GiB, integrated=True)
    budget, source, _ = parse.memory_budget(jetson, runtime_bytes=GiB, inventory_bytes=None)
    assert budget == 5 * GiB and source.startswith("unified memory")  # MemAvailable 6 GiB - 1 GiB runtime < 7 GiB
    small = identity(requested="cuda", type="cuda", name="Nano", memory_bytes=3 * GiB, integrated=True)
    assert parse.memory_budget(small, runtime_bytes=GiB, inventory_bytes=None)[0] == 3 * GiB
    assert parse.memory_budget(small, runtime_bytes=GiB, inventory_bytes=2 * GiB)[:2] == (2 * GiB, "inventory")


def test_a_cpus_budget_and_fingerprint_do_not_change():
    before, cpu = identity(), identity(requested="cpu", type="cpu")
    assert parse.memory_budget(cpu, GiB, None) == parse.memory_budget(before, GiB, None) == (
        5 * GiB, "MemAvailable minus the worker's runtime", 6 * GiB)
    assert parse.fingerprint(cpu) == parse.fingerprint(before)
    gpu = identity(requested="cuda", type="cuda", name="Orin", memory_bytes=7 * GiB, integrated=True)
    assert parse.fingerprint(gpu) != parse.fingerprint(before)


def test_the_profile_table_names_the_gpu():
    from hppctl.cli.profile import compute_label

    d = DeviceProfile(name="nano0", kind="measured:nano0", memory_bytes=GiB, batch_sizes=[1], forward_s=[[1.0]],
                      backward_s=[[1.0]], accelerator=AcceleratorProfile(type="cuda", name="Orin",
                                                                          memory_bytes=7 * GiB, integrated=True))
    assert compute_label(d) == "CUDA Orin, 7.52 GB unified"
    assert "accelerator" not in d.model_copy(update={"accelerator": None}).model_dump()


def test_workers_sharing_one_gpu_share_its_memory_apart_from_the_cpu_devices():
    from hppctl.models.profile import MeasurementInfo
    from hppctl.profiling.sanity import share_machine_memory

    def measured(name: str, gpu: AcceleratorProfile | None, memory: int, source: str) -> DeviceProfile:
        info = MeasurementInfo(hostname="box", cpu_model="x", cpus=4, cpu_quota_cores=None, cpu_quota_source="none",
                               threads=1, clock="wall", repeats=1, warmup=0, sustained_factor=[1.0],
                               step_clock_s=[1.0], memory_budget_source=source, memory_measured_bytes=memory,
                               fingerprint="f", python="3", hppctl="0")
        return DeviceProfile(name=name, kind="measured:box", memory_bytes=memory, batch_sizes=[1], forward_s=[[1.0]],
                             backward_s=[[1.0]], runtime_bytes=GiB, measurement=info, accelerator=gpu)

    gpu = AcceleratorProfile(type="cuda", name="A2000", memory_bytes=12 * GiB, integrated=False)
    devices = [measured("g0", gpu, 12 * GiB, "CUDA memory of A2000"), measured("g1", gpu, 12 * GiB, "CUDA memory of A2000"),
               measured("c0", None, 16 * GiB, "MemAvailable minus the worker's runtime")]
    shared, notes = share_machine_memory(devices, {"g0": "box", "g1": "box", "c0": "box"})
    assert [d.memory_bytes for d in shared] == [6 * GiB, 6 * GiB, 16 * GiB]  # c0 alone: not split with the GPU
    assert len(notes) == 1 and "g0, g1 share box's" in notes[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_profiling_a_local_cuda_device_without_cuda_is_bad_input(cli, tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("name: x\ndevices:\n  - {name: a, local: true}\n  - {name: b, local: true, accelerator: cuda}\n")
    code, out, err = cli("profile", "--cluster", cluster, "--model", "tiny-mlp", "--out", tmp_path / "p.json")
    assert code == 2 and out == "" and err.count("\n") == 1 and not (tmp_path / "p.json").exists()
    assert err.startswith(f"error: {cluster}: devices.1.accelerator: 'cuda' for local device b")
