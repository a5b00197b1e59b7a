"""Interpret an asynchronous schedule (`nf1b`, `pipedream`; docs/timeprest.md) on one device.

One round is the schedule's window (an epoch of K mini-batches): the stage steps its optimizer after
every mini-batch, and every F and B names the weight version it runs with (u = the weights after u
STEPs of this round). Transfers, STEP's optimizer call and the dispatch table are `Executor`'s.

Weight versions: the live parameters are the latest version. A version that an action still needs
after the next STEP (a forward tagged with it at a downstream stage, or pipedream's stashed
backward) is copied when it is made and dropped after its last use; the action list says exactly
which, so no version lives longer than the schedule needs (`async_check.versions_held` is the count).

- `nf1b` forward: run under no_grad with the tagged version and keep only the stage input. Backward:
  recompute the stage forward from that input with the latest weights (PyTorch keeps the forward's
  weights in the graph, so "backward with the latest weights" needs the recomputation), back-
  propagate the gradient (tail: its loss), accumulate; the tail's loss per micro-batch is the summed
  cross-entropy over N·B, so the N backwards of a mini-batch give the gradient of its mean loss.
- `pipedream` forward: build the graph on the tagged version (a stashed copy whenever a STEP comes
  before the backward); backward through that graph (weight stashing), then add the stashed
  copy's gradients to the live parameters' before STEP.

BatchNorm running statistics are updated by the recomputation too (nf1b): a model with BatchNorm
sees its running statistics move twice per micro-batch.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.func import functional_call

from hppctl.models.schedule import Action
from hppctl.runtime.executor import ExecutionError, Executor, RoundStats
from hppctl.runtime.stage import backward_into, input_grads, join


def version_lifetimes(actions: Sequence[Action]) -> tuple[dict[int, tuple[str, int]], set[int]]:
    """The last user (kind, micro-batch) of each version, and the versions used after the STEP that
    replaces them (those are copied when made). F and B of a micro-batch occur once per device."""
    last_user: dict[int, tuple[str, int]] = {}
    last_index: dict[int, int] = {}
    replaced_at: dict[int, int] = {}
    steps = 0
    for i, a in enumerate(actions):
        if a.kind == "STEP":
            replaced_at[steps] = i
            steps += 1
        elif a.version is not None:
            last_user[a.version], last_index[a.version] = (a.kind, a.micro_batch), i
    kept = {v for v, i in last_index.items() if v in replaced_at and i > replaced_at[v]}
    return last_user, kept


class AsyncExecutor(Executor):
    """Runs windows of an asynchronous schedule; `policy` and N come from the schedule."""

    splits_backward = False
    """Asynchronous schedules do not split backwards (models/schedule.py): `I` and `W` are refused."""
    overlaps_allreduce = False
    """PipeDream adds a stashed version's gradients by hand (`_add_stashed_grads`), after the hooks."""

    def __init__(self, *args, policy: str, micro_batches_per_update: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if policy not in ("nf1b", "pipedream"):
            raise ExecutionError(f"{self.device}: not an asynchronous policy: {policy!r}")
        self.policy, self.N = policy, micro_batches_per_update
        self.last_user, self.kept = version_lifetimes(self.actions)
        self.peak_versions = 1

    def run_round(self, round_index: int) -> RoundStats:
        self.version = 0
        self.stash: dict[int, dict[str, torch.Tensor]] = {}
        self._labels: dict[int, torch.Tensor] = {}
        if self.policy == "pipedream":
            self._keep_version()
        return super().run_round(round_index)

    # --- versions ---------------------------------------------------------------------------------
    def _keep_version(self) -> None:
        """Copy the current version if an action needs it after the next STEP: pipedream when the
        version is made (its graphs must not see the in-place update), nf1b just before that STEP
        (until then the live parameters are that version, so no copy exists twice)."""
        if self.version in self.kept:
            grad = self.policy == "pipedream"
            self.stash[self.version] = {n: p.detach().clone().requires_grad_(grad)
                                        for n, p in self.stage.module.named_parameters()}
        self.peak_versions = max(self.peak_versions, len(set(self.stash) | {self.version}))

    def _params(self, a: Action) -> dict[str, torch.Tensor] | None:
        """The tensors of version `a.version`: a stashed copy, or None for the live parameters.

        nf1b runs the latest version on the live parameters (its backward must accumulate there);
        pipedream builds every graph on the copy when there is one, since a STEP comes before the
        backward and updates the live parameters in place."""
        if a.version == self.version and (self.policy == "nf1b" or a.version not in self.stash):
            return None
        if a.version in self.stash:
            return self.stash[a.version]
        if a.version != self.version:
            raise ExecutionError(f"{self.device}: {a} needs weight version {a.version}, which is neither the "
                                 f"latest ({self.version}) nor kept")
        return None

    def _run_stage(self, params: dict | None, values: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        with self.precision.autocast():
            if params is None:
                return self.stage(*values)
            return functional_call(self.stage.module, params, tuple(values))

    # --- compute ----------------------------------------------------------------------------------
    def _inputs_of(self, a: Action) -> list[torch.Tensor]:
        if self.head:
            return [self._data(a.micro_batch)]
        return join(self.stage.inputs, self._collect(self._recv_act.pop(a.micro_batch, []), a, "activations"))

    def _forward(self, a: Action) -> None:
        m = a.micro_batch
        self._check_range(a)
        values = self._inputs_of(a)
        params = self._params(a)
        begin = time.perf_counter()
        if self.policy == "nf1b":
            with torch.no_grad():
                outputs = self._run_stage(params, values)
        else:
            for v, spec in zip(values, self.stage.inputs):
                if spec.carries_grad and not self.head:
                    v.requires_grad_(True)
            outputs = self._run_stage(params, values)
        if self.tail:
            labels = self._labels_of(m)
            loss = self._loss(outputs[0], labels)
            self.stats.loss += float(loss.detach()) * self.N / self.topo.num_micro_batches
            self.stats.correct += int((outputs[0].detach().argmax(dim=1) == labels).sum())
            self.stats.samples += int(labels.shape[0])
            self._labels[m] = labels
            if self.policy == "pipedream":
                self._losses[m] = loss
        else:
            self._outputs[m] = tuple(o.detach() for o in outputs) if self.policy == "nf1b" else outputs
        self._inputs[m] = values
        self._compute_span(a, begin)
        self._after(a)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Summed cross-entropy over the mini-batch's N·B samples: N of these sum to its mean loss."""
        with self.precision.autocast():
            return F.cross_entropy(logits, labels, reduction="sum") / (self.N * self.topo.micro_batch)

    def _backward(self, a: Action) -> None:
        m = a.micro_batch
        self._check_range(a)
        grads = None
        if not self.tail:
            grads = join(self.grad_outputs, self._collect(self._recv_grad.pop(m, []), a, "gradients"))
        begin = time.perf_counter()
        values = self._inputs.pop(m)
        params = self._params(a)
        if self.policy == "nf1b":
            values = [v.detach().requires_grad_(s.carries_grad and not self.head) for v, s in zip(values, self.stage.inputs)]
            outputs = self._run_stage(params, values)  # recompute with the latest weights
            self._outputs.pop(m, None)
            if self.tail:
                self.precision.scale(self._loss(outputs[0], self._labels.pop(m))).backward()
            else:
                backward_into(outputs, self.stage.outputs, grads)
        else:
            if self.tail:
                self._labels.pop(m)
                self.precision.scale(self._losses.pop(m)).backward()
            else:
                backward_into(self._outputs.pop(m), self.stage.outputs, grads)
            if params is not None:
                self._add_stashed_grads(params)
        if not self.head:
            self._input_grads[m] = input_grads(values, self.stage.inputs)
        self._compute_span(a, begin)
        self._after(a)

    def _add_stashed_grads(self, params: dict[str, torch.Tensor]) -> None:
        """PipeDream: the gradient was computed on the stashed version; the update goes to the latest."""
        for name, live in self.stage.module.named_parameters():
            g = params[name].grad
            if g is None:
                continue
            live.grad = g.clone() if live.grad is None else live.grad + g
            params[name].grad = None

    def _after(self, a: Action) -> None:
        """Drop a stashed version after its last use."""
        if a.version in self.stash and self.last_user.get(a.version) == (a.kind, a.micro_batch):
            del self.stash[a.version]

    def _step(self, a: Action) -> None:
        if self.policy == "nf1b":
            self._keep_version()
        super()._step(a)
        self.version += 1
        if self.policy == "pipedream":
            self._keep_version()
        self.peak_versions = max(self.peak_versions, len(set(self.stash) | {self.version}))
