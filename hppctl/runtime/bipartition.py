"""Bi-Partition workers: forward one layer range, backward another, within the synchronous round.

A worker w of a Bi-Partition plan (docs/bipartition.md) forwards F = [f0, f1) and backwards
B = [b0, b1); the ranges interleave with the neighbours', so every layer of the union [min, max)
falls in one of at most five *parts* cut at {f0, f1, b0, b1}:

- both ways (F and B): run with autograd in the forward, back-propagated by the backward;
- forward only: run under `no_grad` (nothing kept: the backward owner recomputes), its weights
  arrive from the backward owner after every round (`RW`);
- backward only (split layers forwarded by a neighbour): the backward re-runs their forward from
  the block's input, then back-propagates: a *suffix* [f1, b1) from the worker's own forward output,
  a *prefix* [b0, f0) from the input received from the previous worker (`RX`), or the data when
  b0 = 0. The recomputation runs on copies of the block's buffers (the forward owner's BatchNorm
  statistics are the real ones; the buffers autograd saved stay untouched until the backward).

The backward owner accumulates the gradients of its layers over the round's micro-batches, steps
once (`STEP`) and sends the split layers' new weights to their forward owner (`SW`) before the
next round's first forward. The loss is computed by the worker whose backward range ends at the
last layer. Cuts 0 (the data, which every worker reads itself) and L carry no message.

Stage state (checkpoints, the final model) holds the parameters a worker steps and the buffers of
the layers it forwards, so the workers' states join into the whole model without overlap; a resumed
worker gets every tensor of the layers it holds from that join (runtime/checkpoint.py: `recut`).
Limitations (docs/bipartition.md, "Limits"; refused before any worker starts by runtime/preflight.py):
no replicated stages, no fault tolerance, no asynchronous windows; recomputing a layer with dropout
draws a different mask than its forward (the built-in training models have none).
"""

from __future__ import annotations

import time
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.func import functional_call

from hppctl.models.schedule import Action
from hppctl.runtime.accelerator import to_wire
from hppctl.runtime.executor import Executor, _Pending, receive_from
from hppctl.runtime.reducer import unflatten_into
from hppctl.runtime.stage import TensorSpec, assign_by_name, backward_into, cut_specs, host_copy, input_grads, join

SPLIT_INPUT_TAG = 1 << 24
"""Tags of SX/RX messages (above every activation/gradient tag of `executor.tag`)."""
WEIGHTS_TAG = 1 << 25


def is_bipartition(schedule) -> bool:
    return any(s.backward_layers is not None for s in schedule.stages)


def union_layers(layers: Sequence[int], backward: Sequence[int] | None) -> tuple[int, int]:
    """The layers a worker holds: its forward and backward ranges together (contiguous when interleaved)."""
    back = backward or layers
    return min(layers[0], back[0]), max(layers[1], back[1])


class BiStage:
    """The parts of one worker's layers, sharing one set of weights (see the module docstring)."""

    def __init__(self, model: str, granularity: str, forward: Sequence[int], backward: Sequence[int], *,
                 num_layers: int, seed: int = 0, tensors: dict[str, torch.Tensor] | None = None,
                 device: torch.device | None = None) -> None:
        from hppctl.zoo import build_stage, get_model, trace

        (self.f0, self.f1), (self.b0, self.b1) = tuple(forward), tuple(backward)
        self.L = num_layers
        spec = get_model(model)
        self.device = device or torch.device("cpu")
        """Where the parts compute and the stepped parameters live (the parts share the tensors)."""
        whole = (spec.build(seed=seed) if tensors is None else spec.build(device="meta")).train()
        if tensors is None:
            whole.to(self.device)
        else:  # the shipped tensors, on the device (the CPU: the same tensors), shared by every part
            assign_by_name(whole, {k: v.to(self.device) for k, v in tensors.items()})
        self.start, self.end = union_layers(forward, backward)
        self.module = build_stage(whole, granularity, self.start, self.end, mode="train")
        cuts = sorted({self.f0, self.f1, self.b0, self.b1})
        self.parts = {(a, b): build_stage(whole, granularity, a, b, mode="train")
                      for a, b in zip(cuts, cuts[1:]) if b > a}
        traced = trace(model, "train")
        self._specs: dict[int, list[TensorSpec]] = {}
        for (a, b), part in self.parts.items():
            self._specs[a], self._specs[b] = cut_specs(traced, part)
        self.inputs, self.outputs = self.specs(self.f0), self.specs(self.f1)
        owned = {n for (a, b), part in self.parts.items() if self.b0 <= a and b <= self.b1
                 for n, _ in part.named_parameters()}
        self._params = {n: p for n, p in self.module.named_parameters() if n in owned}
        self._forward_buffers = {n for (a, b), part in self.parts.items() if self.f0 <= a and b <= self.f1
                                 for n, _ in part.named_buffers()}

    def specs(self, cut: int) -> list[TensorSpec]:
        return self._specs[cut]

    def parts_in(self, lo: int, hi: int) -> list[torch.nn.Module]:
        return [part for (a, b), part in sorted(self.parts.items()) if lo <= a and b <= hi]

    def recompute(self, lo: int, hi: int, values: list[torch.Tensor]) -> list[torch.Tensor]:
        """Re-run the forward of parts [lo, hi), split layers a neighbour forwards, for their backward.

        Each part runs on throwaway copies of its buffers. The forward owner's BatchNorm statistics
        are the real ones, so this forward must not update them a second time; and the buffers must
        not be written between this forward and its backward, since autograd saves some of them
        (BatchNorm's running statistics, BERT's position ids sliced from a buffer): restoring them in
        place after the forward bumped their version and the backward failed ("modified by an
        inplace operation")."""
        for part in self.parts_in(lo, hi):
            scratch = {name: b.detach().clone() for name, b in part.named_buffers()}
            values = list(functional_call(part, scratch, tuple(values)))
        return values

    def parameters(self) -> list[torch.nn.Parameter]:
        """What this worker steps: the parameters of the layers it backwards."""
        return list(self._params.values())

    def weights_between(self, lo: int, hi: int) -> list[torch.Tensor]:
        """Parameters of the split block [lo, hi) shared with a neighbour, in module order."""
        return [p for part in self.parts_in(lo, hi) for p in part.parameters()]

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = {k: host_copy(v) for k, v in self.module.state_dict().items()}
        return {k: v for k, v in state.items() if k in self._params or k in self._forward_buffers}


def _leaves(values: list[torch.Tensor], specs: list[TensorSpec]) -> list[torch.Tensor]:
    return [v.detach().requires_grad_(True) if s.carries_grad else v for v, s in zip(values, specs)]


class BiExecutor(Executor):
    """`Executor` whose F and B run a Bi-Partition worker's ranges, plus the SX/RX/SW/RW actions."""

    splits_backward = False
    """Its `B` recomputes split blocks from their inputs; no split-backward (`I`/`W`) version of it."""

    def __init__(self, device: str, actions, topology, stage: BiStage, optimizer, comm, feed, *, trace=False,
                 accelerator=None, precision=None, **reduce_options) -> None:
        super().__init__(device, actions, topology, stage, optimizer, comm, feed, trace=trace,
                         accelerator=accelerator, precision=precision, **reduce_options)
        self.bi = stage
        self.grad_inputs = [s for s in stage.specs(stage.b0) if s.carries_grad]
        self.grad_outputs = [s for s in stage.specs(stage.b1) if s.carries_grad]

    def more_handlers(self) -> dict:
        st = self.stage  # the BiStage (`self.bi` is not set yet)
        # transfers at cuts 0 and L carry nothing (every worker reads the data; the loss is local)
        edges = {kind: lambda a: None for kind, cut in (("SA", st.f1), ("RA", st.f0), ("SG", st.b0), ("RG", st.b1))
                 if cut in (0, st.L)}
        return {"SX": self._send_split_input, "RX": self._receive_split_input,
                "SW": self._send_weights, "RW": self._receive_weights, **edges}

    def run_round(self, round_index: int):
        self._saved: dict[int, dict] = {}
        self._recv_split: dict[int, list] = {}
        self._split_posted: set[tuple[int, int]] = set()
        return super().run_round(round_index)

    def _post_receives(self) -> None:
        """Split inputs too are posted before the round's first action (why: `Executor._post_receives`)."""
        super()._post_receives()
        for a in self.actions:
            if a.kind == "RX":
                self._receive_split_input(a)

    # --- compute ------------------------------------------------------------------------------
    def _data(self, m: int) -> list[torch.Tensor]:
        return [super()._data(m)]

    def _forward(self, a: Action) -> None:
        m, st = a.micro_batch, self.bi
        self._check_range(a)
        if st.f0 == 0:
            values = self._data(m)
        elif st.f0 == st.L:
            values = []
        else:
            values = join(st.inputs, self._collect(self._recv_act.pop(m, []), a, "activations"))
        begin = time.perf_counter()
        saved = {st.f0: values}
        both_lo, both_hi = max(st.f0, st.b0), min(st.f1, st.b1)
        x = values
        for (lo, hi), part in sorted(st.parts.items()):
            if not (st.f0 <= lo and hi <= st.f1):
                continue
            if both_lo <= lo and hi <= both_hi:
                if lo == both_lo:
                    x = saved["both_in"] = _leaves(x, st.specs(lo))
                with self.precision.autocast():
                    x = list(part(*x))
            else:
                with torch.no_grad(), self.precision.autocast():  # forward only: the backward owner recomputes
                    x = list(part(*x))
            saved[hi] = x
        if both_hi > both_lo:
            saved["both_out"] = saved[both_hi]
        self._saved[m] = saved
        self._outputs[m] = tuple(t.detach() for t in x)
        self._compute_span(a, begin)

    def _backward(self, a: Action) -> None:
        m, st = a.micro_batch, self.bi
        self._check_range(a)
        saved = self._saved.pop(m)
        grads = None
        if st.b1 < st.L and st.b1 > 0:
            grads = join(self.grad_outputs, self._collect(self._recv_grad.pop(m, []), a, "gradients"))
        if st.b0 < st.f0 and st.b0 > 0:
            prefix_in = join(st.specs(st.b0), self._collect(self._recv_split.pop(m, []), a, "split inputs"))
        else:
            prefix_in = self._data(m) if st.b0 == 0 and st.b0 < st.f0 else None
        begin = time.perf_counter()
        if st.b1 > st.f1:  # suffix split: recompute from this worker's own forward output
            grads = self._recompute_and_backprop(st.f1, st.b1, saved[st.f1], grads, m)
        both_lo, both_hi = max(st.f0, st.b0), min(st.f1, st.b1)
        if both_hi > both_lo:
            grads = self._backprop(both_lo, saved["both_in"], saved["both_out"], both_hi, grads, m)
        if st.b0 < st.f0:  # prefix split: recompute from the received input (or the data)
            grads = self._recompute_and_backprop(st.b0, min(st.f0, st.b1), prefix_in, grads, m)
        if st.b0 > 0:
            self._input_grads[m] = grads
        self._compute_span(a, begin)

    def _recompute_and_backprop(self, lo: int, hi: int, values, grads, m: int):
        st = self.bi
        inputs = _leaves(values, st.specs(lo))
        with self.precision.autocast():
            outputs = st.recompute(lo, hi, inputs)
        return self._backprop(lo, inputs, outputs, hi, grads, m)

    def _backprop(self, lo: int, inputs, outputs, hi: int, grads, m: int) -> list[torch.Tensor]:
        """Back-propagate parts [lo, hi) into `inputs`: from the loss at the last layer, else from
        `grads` at cut hi; returns the gradients at cut lo."""
        st = self.bi
        if hi == st.L:
            labels = self._labels_of(m)
            with self.precision.autocast():
                loss = F.cross_entropy(outputs[0], labels, reduction="sum") / self.topo.global_batch
            self.stats.loss += float(loss.detach())
            self.stats.correct += int((outputs[0].detach().argmax(dim=1) == labels).sum())
            self.stats.samples += int(labels.shape[0])
            self.precision.scale(loss).backward()
        else:
            backward_into(outputs, st.specs(hi), grads)
        return input_grads(inputs, st.specs(lo))

    # --- split layers -------------------------------------------------------------------------
    def _send_split_input(self, a: Action) -> None:
        st = self.bi
        values = self._saved[a.micro_batch][st.b1]  # the input of the next worker's prefix split
        tensors = [to_wire(s.rows_of(v.detach(), a.start - self.lo, a.end - self.lo).contiguous(), s.dtype)
                   for v, s in zip(values, st.specs(st.b1))]
        for i, t in enumerate(tensors):
            self.post_send(t, a.peer, SPLIT_INPUT_TAG + a.micro_batch * 64 + i, "split-layer inputs")

    def _receive_split_input(self, a: Action) -> None:
        if (a.micro_batch, a.start) in self._split_posted:  # posted at the start of the round
            return
        self._split_posted.add((a.micro_batch, a.start))
        specs = self.bi.specs(self.bi.b0)
        tensors = [s.empty(a.end - a.start, self.pinned) for s in specs]
        works = [self.comm.irecv(t, a.peer, SPLIT_INPUT_TAG + a.micro_batch * 64 + i) for i, t in enumerate(tensors)]
        self._recv_split.setdefault(a.micro_batch, []).append(
            _Pending(a.start, a.end - a.start, tensors, works, a.peer, time.perf_counter()))

    def _split_block(self, peer_stage: int) -> tuple[int, int]:
        st = self.bi
        if peer_stage < self.topo.stage_of[self.device]:
            return tuple(sorted((st.f0, st.b0)))
        return tuple(sorted((st.f1, st.b1)))

    def _send_weights(self, a: Action) -> None:
        weights = self.bi.weights_between(*self._split_block(self.topo.stage_of[a.peer]))
        if not weights:
            return
        flat = to_wire(torch.cat([w.detach().reshape(-1) for w in weights]))
        self.post_send(flat, a.peer, WEIGHTS_TAG, "weights")

    def _receive_weights(self, a: Action) -> None:
        weights = self.bi.weights_between(*self._split_block(self.topo.stage_of[a.peer]))
        if not weights:
            return
        flat = torch.empty(sum(w.numel() for w in weights), dtype=weights[0].dtype)
        begin = time.perf_counter()
        # the next round's forwards need them
        receive_from(a.peer, "weights", [self.comm.irecv(flat, a.peer, WEIGHTS_TAG)])
        self.stats.wait_s += time.perf_counter() - begin
        unflatten_into(flat, weights)

