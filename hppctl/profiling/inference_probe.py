"""The `inference-blocks` probe kind: one layer's block latencies on this device (Galaxy's profiler).

    python -m hppctl.profiling.probe inference-blocks --import hppctl.profiling.inference_probe \
        --args '{"model": "bert-large", "seq_lens": [284], "repeats": 5}'

For each sequence length it times, with random weights of the model's shapes, on the whole sequence:
the attention block (QKV projection, self-attention, output projection) with 1..n_h heads, the MLP
block (both linears and the activation) with a grid of intermediate columns, and one connective block
(bias, residual add, LayerNorm) with a grid of sequence rows: exactly the code `hppctl run` executes
(`hppctl.runtime.galaxy.hmp`), one device, no communication. Records:

    {"type": "identity", ...}                      (device.identify: host, CPU quota, memory budget)
    {"type": "blocks", "seq_len": 284, "attention": {"sizes": [...], "seconds": [...]}, "mlp": ..., "connective": ...}

Each timing is the fastest of `repeats` passes after `warmup` untimed ones, the garbage collector off:
other work on the machine only ever slows a pass down, and the blocks are deterministic GEMMs.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

from hppctl.profiling.probe import register_kind


def head_grid(heads: int) -> list[int]:
    """Every head count up to 16 heads, else about 12 points including 1 and n_h."""
    if heads <= 16:
        return list(range(1, heads + 1))
    step = max(1, round(heads / 12))
    return sorted({1, *range(step, heads, step), heads})


def fraction_grid(total: int, points: int) -> list[int]:
    """`points` sizes spread up to `total` (whole, increasing, ending at `total`)."""
    return sorted({max(1, round(total * k / points)) for k in range(1, points + 1)})


def fastest_seconds(fn: Callable[[], Any], repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    gc.disable()
    try:
        for _ in range(repeats):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
    finally:
        gc.enable()
    return min(times)


def block_timings(weights: dict[str, Any], seq_len: int, repeats: int, warmup: int) -> dict[str, Any]:
    import torch

    from hppctl.runtime.galaxy.hmp import activation, attention, connective, linear, split_qkv
    from hppctl.runtime.galaxy.weights import device_shard

    meta, layer = weights["meta"], weights["layers"][0]
    heads, hidden, intermediate = meta["heads"], meta["hidden"], layer["w1"].shape[0]
    x = torch.randn(seq_len, hidden)
    result: dict[str, Any] = {"type": "blocks", "seq_len": seq_len}

    def timed(sizes: list[int], make: Callable[[int], Callable[[], Any]]) -> dict[str, Any]:
        with torch.inference_mode():
            return {"sizes": sizes, "seconds": [fastest_seconds(make(n), repeats, warmup) for n in sizes]}

    def attention_pass(a: int) -> Callable[[], Any]:
        part = device_shard(weights, (0, a), (0, intermediate))["layers"][0]
        return lambda: linear(attention(meta, *split_qkv(linear(x, part["wqkv"], part["bqkv"]))), part["wo"])

    def mlp_pass(b: int) -> Callable[[], Any]:
        part = device_shard(weights, (0, heads), (0, b))["layers"][0]
        return lambda: linear(activation(meta, linear(x, part["w1"], part["b1"])), part["w2"])

    def connective_pass(r: int) -> Callable[[], Any]:
        rows = x[:r].clone()
        return lambda: connective(meta, rows, rows + layer["bo"], layer["ln1_w"], layer["ln1_b"],
                                   layer["ln2_w"], layer["ln2_b"])

    result["attention"] = timed(head_grid(heads), attention_pass)
    result["mlp"] = timed(fraction_grid(intermediate, 8), mlp_pass)
    result["connective"] = timed(fraction_grid(seq_len, 4), connective_pass)
    return result


@register_kind("inference-blocks")
def measure(args: dict[str, Any]) -> Iterator[dict[str, Any]]:
    from hppctl.profiling import device

    identity = device.identify(measure_quota=bool(args.get("measure_quota", True)), threads=args.get("threads"))
    yield identity
    import torch

    from hppctl.runtime.galaxy.weights import build_base_model, extract

    torch.set_num_threads(int(identity["threads"]))
    base, family = build_base_model(args["model"], 1, seed=int(args.get("seed", 0)))
    weights = extract(base, family, 1)
    del base
    for seq_len in args["seq_lens"]:
        yield block_timings(weights, int(seq_len), int(args.get("repeats", 5)), int(args.get("warmup", 2)))
