"""CPU time of a fused backward against `I` + `W` (runtime/split_backward.py) on a model cut in three.

    PYTHONPATH=. python -m tests.runtime.split_backward_timing mobilenetv2 16 9 [kernels | memory]

Per stage: the median over REPS of the process CPU time of one backward of one micro-batch of
BATCH samples (single-threaded, on the CPU), fused and split, and how many autograd calls the
`W` makes. With `kernels`, also the CPU time inside aten operators (torch.profiler, self time
summed, medians): the work itself, without autograd's and Python's per-call costs. With
`memory`, also what a micro-batch keeps between its `I` and its `W`: the tensors its forward saved
for backward (parameters not counted), and the gradients `I` captured for `W` besides them.
A measurement script for docs/runtime.md, not a test (no wall-clock assertions).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn.functional as F

from hppctl.runtime.data import load_data
from hppctl.runtime.split_backward import backward_input, backward_weight
from hppctl.runtime.stage import Stage, initial_stage_tensors
from hppctl.zoo import layer_costs


def kernel_ms(block) -> float:
    """Self CPU time (ms) of the aten operators `block()` runs (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        block()
    return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key.startswith("aten::")) / 1e3


def main(model: str, batch: int, reps: int, kernels: bool = False, memory: bool = False) -> None:
    torch.set_num_threads(1)
    n = len(layer_costs(model, "fine"))
    cuts = [(0, n // 3), (n // 3, 2 * n // 3), (2 * n // 3, n)]
    stages = [Stage(model, "fine", lo, hi, tensors=t)
              for (lo, hi), t in zip(cuts, initial_stage_tensors(model, "fine", cuts, seed=1))]
    x, labels = load_data("synthetic", model).train.take(torch.arange(batch))
    values = [x]
    for p, stage in enumerate(stages):
        received = values

        def forward():
            leaves = [v.clone().requires_grad_(p > 0 and s.carries_grad) for v, s in zip(received, stage.inputs)]
            outputs = stage(*leaves)
            if p == len(stages) - 1:
                return leaves, [F.cross_entropy(outputs[0], labels)], [None]
            roots = [o for o, s in zip(outputs, stage.outputs) if s.carries_grad and o.requires_grad]
            return leaves, roots, [torch.ones_like(o) for o in roots]

        fused, first, second, calls = [], [], [], 0
        for _ in range(reps):
            _, roots, grads = forward()
            begin = time.process_time()
            torch.autograd.backward(roots, grads)
            fused.append(time.process_time() - begin)
            stage.module.zero_grad(set_to_none=True)
            leaves, roots, grads = forward()
            begin = time.process_time()
            _, deferred = backward_input(roots, grads, leaves, stage.parameters())
            middle = time.process_time()
            calls = deferred.autograd_calls
            backward_weight(deferred)
            first.append(middle - begin)
            second.append(time.process_time() - middle)
            stage.module.zero_grad(set_to_none=True)
        f, i, w = (statistics.median(v) * 1e3 for v in (fused, first, second))
        print(f"{model} stage {p} layers [{cuts[p][0]}, {cuts[p][1]}) batch {batch}: fused {f:.1f} ms, "
              f"I {i:.1f} + W {w:.1f} = {i + w:.1f} ms ({(i + w) / f:.2f}x), W autograd calls {calls}")
        if kernels:
            print_kernels(stage, forward, reps)
        if memory:
            print_memory(stage, forward)
        with torch.no_grad():
            values = [t.detach() for t in stage(*values)]


def print_kernels(stage: Stage, forward, reps: int) -> None:
    """The medians of `kernel_ms` of fused and split backwards (profiled apart from the timings above)."""
    fused, first, second = [], [], []
    for _ in range(reps):
        _, roots, grads = forward()
        fused.append(kernel_ms(lambda: torch.autograd.backward(roots, grads)))
        leaves, roots, grads = forward()
        split = {}
        first.append(kernel_ms(lambda: split.setdefault("w", backward_input(roots, grads, leaves, stage.parameters())[1])))
        second.append(kernel_ms(lambda: backward_weight(split["w"])))
        stage.module.zero_grad(set_to_none=True)
    f, i, w = (statistics.median(v) for v in (fused, first, second))
    print(f"    in aten operators: fused {f:.1f} ms, I {i:.1f} + W {w:.1f} = {i + w:.1f} ms ({(i + w) / f:.2f}x)")


def print_memory(stage: Stage, forward) -> None:
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        leaves, roots, grads = forward()
    params = {q.untyped_storage().data_ptr() for q in stage.parameters()}
    activations = sum(n for ptr, n in saved.items() if ptr not in params)
    _, deferred = backward_input(roots, grads, leaves, stage.parameters())
    captured = sum(g.numel() * g.element_size() for call in deferred.calls for _, _, g in call.seeds)
    backward_weight(deferred)
    stage.module.zero_grad(set_to_none=True)
    print(f"    kept from I to W: saved activations {activations / 2**20:.1f} MiB, "
          f"captured gradients {captured / 2**20:.1f} MiB (+{captured / activations:.0%})")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), kernels="kernels" in sys.argv[4:],
         memory="memory" in sys.argv[4:])
