"""Training measurement ON the device: per-layer forward/backward times, whole steps, peak memory.

Run by `python -m hppctl.profiling.probe train --args JSON` (probe.py), which prints every
record this module yields as one JSON line. Records (parse.py turns them into a DeviceProfile):

    {"type": "setup", "layers": L, "threads": n, "clock": "cpu"|"wall", "runtime_bytes": …, "model_bytes": …}
    {"type": "progress", "batch_size": b, "phase": "…", "done": k, "total": n}
    {"type": "batch", "batch_size": b, "forward": [[s, …] per layer], "backward": …, "step": {…}, …}
    {"type": "skip", "batch_size": b, "reason": "…"}

How one batch size is measured (docs/profiling.md has the why):

1. one whole training step (forward, loss, backward) of the model, with the process's peak RSS
   reset before it: its peak minus the RSS after the model was built is `peak_bytes`;
2. whole steps back to back for at least `window_s` of wall time (and `min_steps` steps): the
   sustained wall time per step, and each step's time on the probe's clock;
3. `warmup + repeats` passes through the model cut into one fx stage per layer
   (`hppctl.zoo.build_stage`), chained as a pipeline would run them: each layer's forward is
   timed, then each layer's backward in reverse order, with the gradient arriving from the next
   layer. The first `warmup` passes are dropped.

The clock is the process CPU time when torch runs one thread, wall time otherwise. A CFS quota
stops a process for the rest of a period once its budget is spent: a 1 ms layer on a 0.25-core
device takes 1 ms or 16 ms depending on where the period boundary falls, so wall-time samples of
short layers are bimodal and their median is not the layer's cost. CPU time does not count the
stalls. The sustained step measurement (many periods long) then gives the device's wall/CPU
ratio, by which parse.py scales every layer (`sustained_factor`).
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from typing import Any

from hppctl.profiling import device


def _clock(threads: int):
    return time.process_time if threads == 1 else time.perf_counter


def _loss(torch, out, labels):
    """Cross-entropy for (B, classes) logits; mean square for anything else (a scalar to backprop)."""
    if out.dim() == 2 and out.is_floating_point():
        return torch.nn.functional.cross_entropy(out, labels)
    return out.float().square().mean()


def _labels(torch, spec, model, batch: int):
    classes = 2
    for module in model.modules():  # the last Linear's width is the number of classes
        if isinstance(module, torch.nn.Linear):
            classes = module.out_features
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, max(1, classes), (batch,), generator=generator)


class Measurement:
    """One model on this device: the whole module, its one-layer stages, and how to time them."""

    def __init__(self, model_name: str, granularity: str, threads: int, seed: int = 0) -> None:
        import os

        os.environ["OMP_NUM_THREADS"] = str(threads)
        import torch

        torch.set_num_threads(threads)
        self.torch = torch
        from hppctl.zoo import build_stage, get_model, layer_costs

        self.spec = get_model(model_name)
        self.model = self.spec.build(seed=seed)
        self.model.train()
        count = len(layer_costs(model_name, granularity))
        self.stages = [build_stage(self.model, granularity, i, i + 1) for i in range(count)]
        self.threads = threads
        self.clock = _clock(threads)
        self.clock_name = "cpu" if threads == 1 else "wall"
        self.norms_in_eval = False
        self.last_peak = 0
        device.release_free_memory()
        self.model_rss = device.rss_bytes()[0]
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        self.model_bytes = sum(t.numel() * t.element_size() for t in tensors)
        self.runtime_bytes = max(0, self.model_rss - self.model_bytes)
        """Interpreter, torch, transformers and the traced stages: what a worker costs before any tensor."""

    # -- one whole step --------------------------------------------------------------------

    def batch(self, size: int):
        return self.spec.example_input(size), _labels(self.torch, self.spec, self.model, size)

    def step(self, x, labels) -> None:
        self.model.zero_grad(set_to_none=True)
        loss = _loss(self.torch, self.model(x), labels)
        loss.backward()

    def set_norms_eval(self, on: bool) -> None:
        """BatchNorm in eval mode: a training batch of one sample with 1x1 feature maps has a single
        value per channel, which torch refuses in training mode."""
        norm = self.torch.nn.modules.batchnorm._BatchNorm
        for module in self.model.modules():
            if isinstance(module, norm):
                module.train(not on)
        self.norms_in_eval = on

    def first_step(self, x, labels) -> list[str]:
        """The first step at a batch size, falling back to eval-mode BatchNorm if training mode refuses it."""
        self.set_norms_eval(False)
        try:
            self.step(x, labels)
            return []
        except (ValueError, RuntimeError) as e:
            if "value per channel" not in str(e):
                raise
        self.set_norms_eval(True)
        self.step(x, labels)
        return [f"BatchNorm layers in eval mode at batch {x.shape[0]}: training mode needs more than one value per channel"]

    def peak_step(self, x, labels) -> tuple[int, str]:
        """Peak RSS of one training step above the RSS after building the model."""
        self.model.zero_grad(set_to_none=True)
        device.release_free_memory()
        if device.reset_peak_rss():
            self.step(x, labels)
            return max(0, device.rss_bytes()[1] - self.model_rss), "VmHWM after clear_refs"
        self.step(x, labels)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(0, peak - self.model_rss), "ru_maxrss (monotonic)"

    def sustained(self, x, labels, window_s: float, min_steps: int, max_steps: int = 500) -> dict[str, Any]:
        per_step = []
        wall0, cpu0 = time.perf_counter(), time.process_time()
        while len(per_step) < min_steps or (time.perf_counter() - wall0 < window_s and len(per_step) < max_steps):
            t = self.clock()
            self.step(x, labels)
            per_step.append(self.clock() - t)
        return {"count": len(per_step), "wall_s": time.perf_counter() - wall0,
                "cpu_s": time.process_time() - cpu0, "clock_s": per_step}

    def optimizer_step(self, repeats: int = 5) -> list[float]:
        """Seconds of one SGD-with-momentum update of every parameter (grads from the last step)."""
        optimizer = self.torch.optim.SGD(self.model.parameters(), lr=1e-9, momentum=0.9)
        times = []
        for _ in range(repeats + 1):
            t = self.clock()
            optimizer.step()
            times.append(self.clock() - t)
        return times[1:]

    # -- layer by layer --------------------------------------------------------------------

    def _leaf(self, value):
        torch = self.torch
        if isinstance(value, torch.Tensor):
            leaf = value.detach()
            if leaf.is_floating_point():
                leaf.requires_grad_(True)
            return leaf
        return value

    def layer_pass(self, x, labels) -> tuple[list[float], list[float]]:
        """One pipelined pass, one stage per layer: (forward seconds, backward seconds) per layer."""
        torch, clock, count = self.torch, self.clock, len(self.stages)
        self.model.zero_grad(set_to_none=True)
        forward, backward = [0.0] * count, [0.0] * count
        inputs: list[tuple] = []
        outputs: list[tuple] = []
        values: tuple = (x,)
        for i, stage in enumerate(self.stages):
            if i > 0:
                values = tuple(self._leaf(v) for v in values)
            inputs.append(values)
            t = clock()
            out = stage(*values)
            if i == count - 1:
                out = (_loss(torch, out[0], labels),)
            forward[i] = clock() - t
            outputs.append(out)
            values = out
        for i in reversed(range(count)):
            if i == count - 1:
                tensors, grads = [outputs[i][0]], [None]
            else:
                pairs = [(o, leaf.grad) for o, leaf in zip(outputs[i], inputs[i + 1])
                         if isinstance(leaf, torch.Tensor) and leaf.requires_grad and leaf.grad is not None
                         and isinstance(o, torch.Tensor) and o.requires_grad]
                tensors, grads = [p[0] for p in pairs], [p[1] for p in pairs]
            t = clock()
            if tensors:
                torch.autograd.backward(tensors, grads)
            backward[i] = clock() - t
            outputs[i] = ()
            if i + 1 < count:
                inputs[i + 1] = ()
        return forward, backward


def measure(args: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The `train` probe kind: records for every batch size in `args["batch_sizes"]` (ascending)."""
    threads = int(args["threads"])
    repeats, warmup = int(args.get("repeats", 7)), int(args.get("warmup", 2))
    window_s, min_steps = float(args.get("window_s", 1.0)), int(args.get("min_steps", 3))
    budget = args.get("memory_budget_bytes")
    started = time.perf_counter()
    m = Measurement(args["model"], args["granularity"], threads, int(args.get("seed", 0)))
    yield {"type": "setup", "layers": len(m.stages), "threads": threads, "clock": m.clock_name,
           "runtime_bytes": m.runtime_bytes, "model_bytes": m.model_bytes,
           "param_bytes": sum(p.numel() * p.element_size() for p in m.model.parameters()),
           "setup_s": time.perf_counter() - started, "model_fingerprint": m.spec.fingerprint()}
    previous: tuple[int, int] | None = None  # (batch, peak bytes)
    sizes = sorted(int(b) for b in args["batch_sizes"])
    for k, b in enumerate(sizes):
        if budget and previous is not None:
            predicted = m.model_rss + previous[1] * b / previous[0]
            if predicted > 0.9 * budget:
                for rest in sizes[k:]:
                    yield {"type": "skip", "batch_size": rest,
                           "reason": f"predicted peak {predicted / 1e6:.0f} MB at batch {b} exceeds 90% of the "
                                     f"{budget / 1e6:.0f} MB budget"}
                return
        yield from _one_batch(m, b, repeats, warmup, window_s, min_steps)
        previous = (b, m.last_peak)


def _one_batch(m: Measurement, b: int, repeats: int, warmup: int, window_s: float, min_steps: int):
    total = 3 + warmup + repeats
    yield {"type": "progress", "batch_size": b, "phase": "memory", "done": 0, "total": total}
    x, labels = m.batch(b)
    notes = m.first_step(x, labels)
    peak, peak_method = m.peak_step(x, labels)
    m.last_peak = peak
    yield {"type": "progress", "batch_size": b, "phase": "whole steps", "done": 2, "total": total}
    step = m.sustained(x, labels, window_s, min_steps)
    optimizer = m.optimizer_step()
    forward: list[list[float]] = [[] for _ in m.stages]
    backward: list[list[float]] = [[] for _ in m.stages]
    for r in range(warmup + repeats):
        yield {"type": "progress", "batch_size": b, "phase": "layers", "done": 3 + r, "total": total}
        f, bw = m.layer_pass(x, labels)
        if r >= warmup:
            for i in range(len(m.stages)):
                forward[i].append(f[i])
                backward[i].append(bw[i])
    m.set_norms_eval(False)
    yield {"type": "batch", "batch_size": b, "clock": m.clock_name, "forward": forward, "backward": backward,
           "step": step, "optimizer_step_s": optimizer, "peak_bytes": peak, "peak_method": peak_method,
           "notes": notes}
