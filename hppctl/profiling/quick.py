"""A quick measured profile of `local:` devices, for `hppctl demo` when the full profiler is absent.

The full profiler (`hppctl.profiling.cluster.profile_cluster`, docs/profiling.md) measures each
device in its own process with repeats, memory peaks and CPU-quota handling. This one is the
minimum the demo needs, in this process: the model cut into one stage per layer, each layer's
forward, backward and the backward's weight-gradient part timed on a small batch grid (median of
`repeats` after one warm-up) with the thread count the workers will use. Local workers share this machine, so the times are scaled by
the contention of the run: workers × threads / cores (three one-thread workers on two cores each
get about 2/3 of a core while all compute). All local devices get the same timings; memory
budgets split the available memory evenly; links are one loopback TCP measurement.
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time

from hppctl.models.cluster import ClusterSpec
from hppctl.models.profile import DeviceProfile, Profile


def layer_times(model: str, granularity: str, batch_sizes: list[int], *, threads: int, repeats: int = 3,
                seed: int = 0) -> tuple[list[list[float]], list[list[float]], list[list[float]]]:
    """forward_s[layer][i], backward_s[layer][i], weight_grad_s[layer][i] at batch_sizes[i].

    Each layer's backward is timed twice on its retained graph: first to its inputs only
    (`torch.autograd.grad`, which skips the weight gradients), then whole; its weight-gradient time
    is the difference, clamped into [0, backward], as the full profiler's (train_probe.layer_pass).
    The data requires a gradient too, so that layer 0 is measured as every other layer."""
    import torch

    from hppctl.zoo import build_stage, get_model, layer_costs

    torch.set_num_threads(threads)
    spec = get_model(model)
    whole = spec.build(seed=seed).train()
    count = len(layer_costs(model, granularity))
    stages = [build_stage(whole, granularity, i, i + 1, mode="train") for i in range(count)]
    rows = lambda: [[0.0] * len(batch_sizes) for _ in range(count)]  # noqa: E731
    forward, backward, weight_grad = rows(), rows(), rows()
    for j, b in enumerate(batch_sizes):
        samples = {"f": [[] for _ in range(count)], "b": [[] for _ in range(count)], "w": [[] for _ in range(count)]}
        for attempt in range(repeats + 1):
            values, kept = [spec.example_input(b)], []
            for i, st in enumerate(stages):
                inputs = [v.detach().requires_grad_(v.is_floating_point()) for v in values]
                begin = time.perf_counter()
                outputs = st(*inputs)
                samples["f"][i].append(time.perf_counter() - begin)
                kept.append((inputs, outputs))
                values = outputs
            grads = None
            for i in reversed(range(count)):
                inputs, outputs = kept[i]
                pairs = [(o, torch.ones_like(o) if grads is None else g) for o, g in
                         zip(outputs, grads or [None] * len(outputs)) if o.requires_grad]
                whole_s, input_only_s = _timed_backward(torch, pairs, [v for v in inputs if v.requires_grad])
                samples["b"][i].append(whole_s)
                samples["w"][i].append(min(whole_s, max(0.0, whole_s - input_only_s)))
                grads = [v.grad if v.grad is not None else torch.zeros_like(v) if v.is_floating_point() else None
                         for v in inputs]
            if attempt == 0:  # warm-up
                samples = {k: [[] for _ in range(count)] for k in samples}
        for i in range(count):
            forward[i][j] = statistics.median(samples["f"][i])
            backward[i][j] = statistics.median(samples["b"][i])
            weight_grad[i][j] = statistics.median(samples["w"][i])
    return forward, backward, weight_grad


def _timed_backward(torch, pairs: list, inputs: list) -> tuple[float, float]:
    """(seconds of the whole backward of `pairs` (output, gradient), seconds of its input-only part)."""
    if not pairs:
        return 0.0, 0.0
    outputs, gradients = [o for o, _ in pairs], [g for _, g in pairs]
    begin = time.perf_counter()
    if inputs:
        torch.autograd.grad(outputs, inputs, gradients, retain_graph=True, allow_unused=True)
    input_only = time.perf_counter() - begin
    begin = time.perf_counter()
    torch.autograd.backward(outputs, gradients)
    return time.perf_counter() - begin, input_only


def loopback_bytes_per_s(megabytes: int = 64) -> float:
    """One TCP transfer over 127.0.0.1."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    payload = b"\0" * 2**20

    def sink() -> None:
        conn, _ = server.accept()
        with conn:
            while conn.recv(2**20):
                pass

    thread = threading.Thread(target=sink, daemon=True)
    thread.start()
    with socket.create_connection(server.getsockname()) as client:
        begin = time.perf_counter()
        for _ in range(megabytes):
            client.sendall(payload)
    thread.join(timeout=10)
    server.close()
    return megabytes * 2**20 / (time.perf_counter() - begin)


def available_memory_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 2 * 10**9


def quick_profile(cluster: ClusterSpec, model: str, *, granularity: str = "fine", batch_sizes: list[int],
                  threads: int = 1, optimizer_state_factor: float = 1.0) -> Profile:
    from hppctl.zoo import layer_costs

    local = [d for d in cluster.devices if d.local]
    if len(local) != len(cluster.devices):
        raise ValueError("quick_profile measures local devices only")
    times = layer_times(model, granularity, batch_sizes, threads=threads)
    contention = max(1.0, len(local) * threads / (os.cpu_count() or 1))
    forward, backward, weight_grad = ([[t * contention for t in row] for row in rows] for rows in times)
    budget = available_memory_bytes() // len(local)
    devices = [DeviceProfile(name=d.name, kind=f"measured:{socket.gethostname()}", memory_bytes=d.memory or budget,
                             batch_sizes=list(batch_sizes), forward_s=forward, backward_s=backward,
                             weight_grad_s=weight_grad) for d in local]
    rate = loopback_bytes_per_s()
    return Profile(source="measured", cluster=cluster.name, model=model, granularity=granularity,
                   optimizer_state_factor=optimizer_state_factor, layers=layer_costs(model, granularity),
                   devices=devices, default_bytes_per_s=rate)
