"""Training measurement ON the device: per-layer forward/backward times, whole steps, peak memory.

Run by `python -m hppctl.profiling.probe train --args JSON` (probe.py), which prints every
record this module yields as one JSON line. Records (parse.py turns them into a DeviceProfile):

    {"type": "setup", "layers": L, "threads": n, "clock": "cpu"|"wall", "runtime_bytes": …, "model_bytes": …}
    {"type": "memory", "batch_size": b, "peak_bytes": …, "notes": […], "optimizer_step_s": […]}
    {"type": "pass", "batch_size": b, "forward": [s per layer], "backward": […], "weight_grad": […],
     "step": {count, wall_s, cpu_s, clock_s}}
    {"type": "skip", "batch_size": b, "reason": "…"}
    {"type": "progress", "batch_size": b, "phase": "…", "done": k, "total": n}

What is measured (docs/profiling.md has the why):

1. per batch size, ascending: one whole training step (forward, loss, backward) of the model,
   then one more with the process's peak RSS reset before it: its peak minus the RSS after the
   model was built is `peak_bytes`. A batch size whose predicted peak would not fit the memory
   budget is skipped, with every larger one;
2. `warmup + repeats` rounds; in each, for every batch size: one pass through the model cut into
   one fx stage per layer (`hppctl.zoo.build_stage`), chained as a pipeline would run them: each
   layer's forward is timed, then each layer's backward in reverse order with the gradient
   arriving from the next layer, first back-propagating to the layers' inputs only (the backward
   without the weight gradients), then the whole backward: a layer's `weight_grad` is the
   difference (`Measurement.layer_pass`); then whole steps back to back for `window_s / repeats` of wall
   time (at least one). The warm-up rounds are not reported; every other round is one `pass`
   record, so an interrupted measurement resumes from the passes the cache holds.

The clock is the process CPU time when torch runs one thread, wall time otherwise. A CFS quota
stops a process for the rest of a period once its budget is spent: a 1 ms layer on a 0.25-core
device takes 1 ms or 76 ms (100 ms periods) depending on where the period boundary falls, so
wall-time samples of short layers are bimodal and their median is not the layer's cost. CPU time
does not count the stalls. The sustained step measurement (many periods long) then gives the
device's wall/CPU ratio, by which parse.py scales every layer (`sustained_factor`).

On an accelerator (`args["accelerator"]`: the cluster file's value, resolved here by
runtime/accelerator.py as a worker resolves it) the model, the inputs and the labels live on the
GPU, every clock reading waits for the queued CUDA work first (`synchronized_clock`: kernels run
asynchronously, so a plain host clock would time their launch), the clock is wall time, and a
step's peak memory is the CUDA allocator's (`torch.cuda.max_memory_allocated` above the model's
allocation) instead of the process's RSS. On the CPU nothing of this changes a measurement.
"""

from __future__ import annotations

import gc
import resource
import statistics
import time
from contextlib import contextmanager
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


def _labels(torch, spec, model, batch: int, device=None):
    classes = 2
    for module in model.modules():  # the last Linear's width is the number of classes
        if isinstance(module, torch.nn.Linear):
            classes = module.out_features
    generator = torch.Generator().manual_seed(1)
    labels = torch.randint(0, max(1, classes), (batch,), generator=generator)
    return labels if device is None else labels.to(device)


class Measurement:
    """One model on this device: the whole module, its one-layer stages, and how to time them."""

    def __init__(self, model_name: str, granularity: str, threads: int, seed: int = 0, accelerator: str = "cpu") -> None:
        import os
        import sys

        if "torch" not in sys.modules:  # read when torch starts (the probe's own process); in a process
            os.environ["OMP_NUM_THREADS"] = str(threads)  # that has torch already it would only leak
        import torch

        torch.set_num_threads(threads)
        self.torch = torch
        from hppctl.runtime import accelerator as acc
        from hppctl.zoo import build_stage, get_model, layer_costs

        self.acc = acc
        self.device = acc.resolve(accelerator)
        """Where the layers are timed: the device a worker with this `accelerator:` computes on."""
        self.spec = get_model(model_name)
        self.model = self.spec.build(seed=seed).to(self.device)  # the CPU: the same module
        self.model.train()
        costs = layer_costs(model_name, granularity)
        count = len(costs)
        self.activation_bytes_per_sample = sum(c.activation_bytes_per_sample for c in costs)
        """What the forward keeps for the backward, per sample (the zoo's sizes): a lower bound on a step's peak."""
        self.stages = [build_stage(self.model, granularity, i, i + 1) for i in range(count)]
        self._granularity = granularity
        self.threads = threads
        on_cpu = self.device.type == "cpu"
        self.clock = acc.synchronized_clock(self.device, _clock(threads) if on_cpu else time.perf_counter)
        self.clock_name = "cpu" if threads == 1 and on_cpu else "wall"
        self.norms_in_eval = False
        self.eval_norms: dict[int, bool] = {}
        """Batch sizes at which BatchNorm must run in eval mode (first_step)."""
        device.release_free_memory()
        self.model_rss = device.rss_bytes()[0]
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        self.model_bytes = sum(t.numel() * t.element_size() for t in tensors)
        self.runtime_bytes = max(0, self.model_rss - self.model_bytes) if on_cpu else self.model_rss
        """Interpreter, torch, transformers and the traced stages: what a worker costs before any tensor
        (on a GPU device, host memory: the model's tensors are not in the RSS)."""
        allocated = acc.allocated_bytes(self.device)
        self.model_resident = self.model_rss if allocated is None else allocated
        """What holds the model where the steps' memory is counted: the RSS, or the CUDA allocation."""

    # -- one whole step --------------------------------------------------------------------

    def batch(self, size: int):
        return (self.spec.example_input(size).to(self.device),
                _labels(self.torch, self.spec, self.model, size, self.device))

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
        """Peak RSS of one training step above the RSS after building the model (on a GPU: the CUDA
        allocator's peak above the model's allocation)."""
        self.model.zero_grad(set_to_none=True)
        if self.device.type != "cpu":
            self.acc.reset_peak_memory(self.device)
            self.step(x, labels)
            self.acc.synchronize(self.device)
            return max(0, self.acc.peak_memory_bytes(self.device) - self.model_resident), "torch.cuda.max_memory_allocated"
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

    def stage_call_cost(self, batch: int = 2, reps: int = 7, warmup: int = 2) -> float:
        """Seconds a layer pass adds to each layer's forward by calling its one-layer stage on its own.

        A runtime stage is ONE traced module over all its layers; the layer pass calls one traced
        module per layer and times each call, so every layer's forward carries a module call, its
        attribute lookups and the clock (~13 us per layer on the project's VM: 9 % of mobilenetv2's
        142-layer step at batch 1, 2 % at batch 16). The cost does not depend on the batch, so it is
        measured once: the layer pass's summed forward against one module over every layer (forward
        and loss, as the pass's last layer times them), interleaved `reps` times, median difference
        per layer. parse.py takes it off every forward time."""
        from hppctl.zoo import build_stage

        torch, clock, count = self.torch, self.clock, len(self.stages)
        fused = build_stage(self.model, self._granularity, 0, count)
        x, labels = self.batch(batch)
        self.set_norms_eval(True)  # any batch works in eval mode, and the cost is the same
        differences = []
        try:
            with _no_gc():
                for r in range(warmup + reps):
                    forward, _, _ = self.layer_pass(x, labels, split=False)
                    self.model.zero_grad(set_to_none=True)
                    t = clock()
                    out = fused(x)
                    loss = _loss(torch, out[0], labels)
                    whole = clock() - t
                    del out, loss
                    if r >= warmup:
                        differences.append(sum(forward) - whole)
        finally:
            self.set_norms_eval(False)
        return max(0.0, statistics.median(differences)) / count

    def layer_pass(self, x, labels, *, split: bool = True) -> tuple[list[float], list[float], list[float] | None]:
        """One training step through the one-layer stages: (forward, backward, weight-gradient) seconds per layer.

        The stages are chained on the live autograd graph, so backward is ONE engine run, as in a
        real step; it is split by layer with a hook on the first tensor each layer produces. The CPU
        engine runs ready nodes newest first, i.e. layer by layer from the last one, and a tensor's
        hook fires as its producing node starts: layer i's backward is the time from its hook to the
        next hook of an earlier layer (to the end of the run for the first layer). A layer that makes
        no new autograd node (a pass-through) gets 0 and its successor in backward order the time.

        With `split`, the same graph is first back-propagated to the layers' inputs only
        (`torch.autograd.grad` with the tensors that cross the cuts as `inputs`, the graph retained):
        autograd then skips every weight gradient, and the same hooks split that run by layer. A
        layer's weight-gradient time is its backward minus that input-only backward, clamped into
        [0, backward] (the two runs' noise). Layer 0's input, the data, needs no gradient in a real
        step (nor here: its backward is a real head's), so it is measured as if it did, on its own
        (`_first_layer_weight_grad`): defined as every other layer's.
        """
        torch, count = self.torch, len(self.stages)
        self.model.zero_grad(set_to_none=True)
        forward, starts, crossing, loss, first_out = self._stamped_forward(x, labels)
        weight_grad = None
        if split:
            inputs = [t for t in crossing if t.requires_grad]
            received: list = []
            input_only, _ = self._stamped_backward(starts, lambda: received.extend(torch.autograd.grad(
                loss, inputs, retain_graph=True, allow_unused=True)))
            starts[:] = [None] * count
            # Only layer 0's output gradients are needed later; the others (every activation's size)
            # would stay alive through the whole backward and slow it (measured: +15-25 %).
            wanted = {id(o) for o in first_out}
            received = {id(t): g for t, g in zip(inputs, received) if id(t) in wanted}
        backward, set_up = self._stamped_backward(starts, loss.backward)
        if split:
            weight_grad = [min(b, max(0.0, b - i)) for b, i in zip(backward, input_only)]
            weight_grad[0] = self._first_layer_weight_grad(x, first_out, received, backward[0], weight_grad[0])
        backward[-1] += set_up  # a real step pays it: the last layer's backward, as before
        return forward, backward, weight_grad

    def _first_layer_weight_grad(self, x, first_out: tuple, received: dict[int, Any], backward: float,
                                 in_pass: float) -> float:
        """Layer 0's weight-gradient seconds as if the data needed a gradient, as every other layer's
        input does: a second forward of layer 0 alone on a copy of the data that requires one, then
        its backward from the gradients the pass's input-only run delivered to its outputs, to the
        data only and to the data and its parameters, each one engine run after an untimed one; the
        difference, at most the layer's `backward`. Integer data (token ids) can carry no gradient:
        layer 0's input-only backward is empty, so its whole backward is its weight gradient (the
        pass's own figure would read the end of the engine run as input-gradient work). `in_pass`
        when there is nothing to run (a single layer, or no gradient reached layer 0)."""
        torch, clock = self.torch, self.clock
        if isinstance(x, torch.Tensor) and not x.is_floating_point():
            return backward
        picked = [(k, received.get(id(o))) for k, o in enumerate(first_out)
                  if isinstance(o, torch.Tensor) and o.requires_grad]
        picked = [(k, g) for k, g in picked if g is not None]
        if len(self.stages) < 2 or not isinstance(x, torch.Tensor) or not picked:
            return in_pass
        data = x.detach().requires_grad_(True)
        out = self.stages[0](data)
        outputs, grads = [out[k] for k, _ in picked], [g for _, g in picked]
        params = [p for p in self.stages[0].parameters() if p.requires_grad]
        seconds = []
        for inputs in ([data], [data], [data, *params]):  # the first one untimed: it meets cold caches
            t = clock()
            torch.autograd.grad(outputs, inputs, grads, retain_graph=True, allow_unused=True)
            seconds.append(clock() - t)
        return min(backward, max(0.0, seconds[2] - seconds[1]))

    def _stamped_forward(self, x, labels) -> tuple[list[float], list[float | None], list, Any, tuple]:
        """Each layer's forward time, the hook stamps its backward will fill, the tensors that cross
        the cuts (x first), the loss, and layer 0's outputs."""
        torch, clock, count = self.torch, self.clock, len(self.stages)
        forward = [0.0] * count
        starts: list[float | None] = [None] * count
        seen: set[int] = set()
        crossing: dict[int, Any] = {id(x): x} if isinstance(x, torch.Tensor) else {}
        values: tuple = (x,)
        for i, stage in enumerate(self.stages):
            t = clock()
            out = stage(*values)
            if i == count - 1:
                out = (_loss(torch, out[0], labels),)
            forward[i] = clock() - t
            new = [o for o in out if isinstance(o, torch.Tensor) and o.grad_fn is not None and id(o.grad_fn) not in seen]
            seen.update(id(o.grad_fn) for o in new)
            if new:
                def stamp(_grad, i=i):
                    if starts[i] is None:
                        starts[i] = clock()
                for o in new:
                    o.register_hook(stamp)
            if new and i < count - 1:
                crossing.update((id(o), o) for o in out if isinstance(o, torch.Tensor))
            values = out
            if i == 0:
                first_out = out
        return forward, starts, list(crossing.values()), values[0], first_out

    def _stamped_backward(self, starts: list[float | None], run) -> tuple[list[float], float]:
        """`run()` (one backward engine run) timed layer by layer from the hook stamps (layer_pass),
        and the engine's set-up before the loss's node ran (the last layer's hook): what the engine
        does before any layer. An input-only run's set-up walks the graph to find what the inputs
        need, which is not weight-gradient work: layer_pass charges both runs the full run's."""
        clock, count = self.clock, len(self.stages)
        begin = clock()
        run()
        end = clock()
        if starts[count - 1] is None:
            starts[count - 1] = begin
        seconds = [0.0] * count
        for i in range(count):
            if starts[i] is None:
                continue
            later = [starts[j] for j in range(i) if starts[j] is not None]
            seconds[i] = (later[-1] if later else end) - starts[i]
        return seconds, starts[count - 1] - begin


def measure(args: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The `train` probe kind (module docstring). `args`: model, granularity, batch_sizes, threads,
    repeats, warmup, window_s, memory_budget_bytes, model_input (a user model's), and
    `passes` {batch size: timed passes still
    needed} when resuming (default: `repeats` for every batch size)."""
    threads = int(args["threads"])
    repeats, warmup = int(args.get("repeats", 7)), int(args.get("warmup", 2))
    window_s = float(args.get("window_s", 1.0))
    budget = args.get("memory_budget_bytes")
    sizes = sorted(int(b) for b in args["batch_sizes"])
    needed = {b: int(args.get("passes", {}).get(str(b), repeats)) for b in sizes}
    started = time.perf_counter()
    if args.get("model_input"):  # a user model's input spec (zoo/user.py), as the orchestrator resolved it
        from hppctl.models.profile import ModelInput
        from hppctl.zoo.user import declare_input

        declare_input(args["model"], ModelInput.model_validate(args["model_input"]))
    m = Measurement(args["model"], args["granularity"], threads, int(args.get("seed", 0)),
                    accelerator=str(args.get("accelerator", "cpu")))
    stage_call_s = m.stage_call_cost()
    yield {"type": "setup", "layers": len(m.stages), "threads": threads, "clock": m.clock_name,
           "runtime_bytes": m.runtime_bytes, "model_bytes": m.model_bytes,
           "param_bytes": sum(p.numel() * p.element_size() for p in m.model.parameters()),
           "setup_s": time.perf_counter() - started, "model_fingerprint": m.spec.fingerprint(),
           "stage_call_s": stage_call_s}
    fitting: list[int] = []
    for record in _memory_phase(m, sizes, budget):
        yield record
        if record["type"] == "memory":
            fitting.append(record["batch_size"])
    yield from _rounds(m, fitting, needed, warmup, window_s / max(1, repeats))


def _memory_phase(m: Measurement, sizes: list[int], budget: int | None) -> Iterator[dict[str, Any]]:
    """Ascending batch sizes: the first step (and the BatchNorm fallback), then the peak memory of one
    step; stops before a batch size whose predicted peak would not fit 90% of the budget."""
    previous: tuple[int, int] | None = None  # (batch, peak bytes)
    for k, b in enumerate(sizes):
        reason = _would_not_fit(m, b, budget, previous)
        if reason:
            for rest in sizes[k:]:
                yield {"type": "skip", "batch_size": rest, "reason": reason}
            return
        yield {"type": "progress", "batch_size": b, "phase": "memory", "done": k, "total": len(sizes)}
        x, labels = m.batch(b)
        notes = m.first_step(x, labels)
        m.eval_norms[b] = m.norms_in_eval
        peak, method = m.peak_step(x, labels)
        m.set_norms_eval(False)
        previous = (b, peak)
        yield {"type": "memory", "batch_size": b, "peak_bytes": peak, "peak_method": method, "notes": notes,
               "optimizer_step_s": m.optimizer_step()}


def _would_not_fit(m: Measurement, batch: int, budget: int | None, previous: tuple[int, int] | None) -> str | None:
    """Why a step at `batch` would not fit 90% of the budget, or None. Predicted from the previous batch
    size's measured peak, proportionally, and never below the activations the forward keeps (the zoo's
    sizes: a lower bound, and the only estimate before the first step), so that a batch far too large
    is skipped instead of asking the allocator for it (or waking the kernel's OOM killer)."""
    if not budget:
        return None
    kept = m.activation_bytes_per_sample * batch
    scaled = previous[1] * batch / previous[0] if previous else 0.0
    predicted = m.model_resident + max(kept, scaled)
    if predicted <= 0.9 * budget:
        return None
    basis = f"from batch {previous[0]}'s peak" if scaled >= kept else "at least, from the activations kept for the backward"
    return (f"predicted peak {predicted / 1e6:.0f} MB at batch {batch} ({basis}) exceeds 90% of the "
            f"{budget / 1e6:.0f} MB budget")


@contextmanager
def _no_gc():
    """The cyclic garbage collector off while timing (as timeit does): a collection of the interpreter's
    heap, which torch and transformers make large, would land on whichever layer happened to allocate.
    It runs as usual between passes; autograd graphs are freed by reference counting anyway."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _rounds(m: Measurement, sizes: list[int], needed: dict[int, int], warmup: int,
            window_s: float) -> Iterator[dict[str, Any]]:
    """Round-robin over the batch sizes: each round runs one layer pass and a short window of whole
    steps at every batch size that still needs passes. A burst of load from elsewhere then slows
    one pass of every batch size instead of every pass of one, and the medians ignore it."""
    inputs = {b: m.batch(b) for b in sizes}
    rounds = warmup + max((needed[b] for b in sizes), default=0)
    total = sum(warmup + needed[b] for b in sizes)
    done = 0
    for r in range(rounds):
        for b in sizes:
            if r >= warmup + needed[b]:
                continue
            x, labels = inputs[b]
            m.set_norms_eval(m.eval_norms.get(b, False))
            timed = r >= warmup
            with _no_gc():
                forward, backward, weight_grad = m.layer_pass(x, labels)
                step = m.sustained(x, labels, window_s, 1) if timed else None
            m.set_norms_eval(False)
            done += 1
            if timed:
                yield {"type": "pass", "batch_size": b, "forward": forward, "backward": backward,
                       "weight_grad": weight_grad, "step": step}
            yield {"type": "progress", "batch_size": b, "phase": "warm-up" if not timed else f"pass {r - warmup + 1}",
                   "done": done, "total": total}
