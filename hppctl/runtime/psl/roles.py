"""One batch update of parallel split learning, from each side: `Client` (parts 1 and 3, the data,
the loss) and `Helper` (one part-2 copy per assigned client, tasks in the plan's order).

Client j, one batch (the paper's Fig. 2):

    r   part 1 forward, send the cut-σ1 activations to the helper
    l   receive the cut-σ2 activations, part 3 forward, loss (mean cross-entropy over the batch)
    l′  part 3 backward, send the cut-σ2 gradients to the helper
    r′  receive the cut-σ1 gradients, part 1 backward, optimizer step (parts 1 and 3)

Helper i serves its tasks in `PslTopology.orders[i]`: F:j receives j's activations, runs j's part-2
copy, sends the result; B:j receives j's gradients, back-propagates them through j's copy, sends
the input gradients and steps j's optimizer. A task starts when it is next in the order and its
input has arrived; nothing is reordered at run time (so a plan's order is what runs). With
`--order ltf` the helper instead picks, whenever it is free, among the tasks whose input has
arrived the one with the most client work left after it (`topology.task_tails`), without
preemption: the notes' online form of the largest-tail-first rule.

Receives are posted when a batch starts, so transfers proceed while the receiver computes (gloo
moves a message once its receive is posted). Each message is tagged (batch step, channel, tensor
index), as the HPP executor tags micro-batches. Times are measured from the batch's start (every
rank leaves a barrier together), so a client's `completion_s` is its c_j and the batch makespan is
the largest of them.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from hppctl.errors import RuntimeFailure
from hppctl.runtime.executor import ACTIVATIONS, CARRIES, GRADIENTS, Outgoing, receive_from, tag, wait_sent
from hppctl.runtime.stage import Stage, TensorSpec, backward_into, input_grads


def _post_receives(specs: list[TensorSpec], batch: int, peer: int, step: int, channel: int):
    import torch.distributed as dist

    tensors = [s.empty(batch) for s in specs]
    works = [dist.irecv(t, peer, tag=tag(step, channel, i)) for i, t in enumerate(tensors)]
    return tensors, works


def _send(tensors: list[torch.Tensor], peer: str, rank: int, step: int, channel: int) -> list[Outgoing]:
    import torch.distributed as dist

    return [Outgoing(dist.isend(t, rank, tag=tag(step, channel, i)), t, peer, CARRIES[channel])
            for i, t in enumerate(tensors)]


TASK_INPUT = {"F": CARRIES[ACTIVATIONS], "B": CARRIES[GRADIENTS]}
"""What a helper's task of each kind waits for from its client."""


def _input_grads(values: list[torch.Tensor], specs: list[TensorSpec]) -> list[torch.Tensor]:
    return [g.contiguous() for g in input_grads(values, specs)]


@dataclass
class ClientBatch:
    step: int
    started_at: float = 0.0
    """Wall-clock time (time.time()) of the batch's start; the times below count from it."""
    completion_s: float = 0.0
    """c_j: from the batch's start to the end of the part-1 backward and the optimizer step."""
    sent_s: float = 0.0
    """r as run: part 1 forward and the upload done."""
    activations_s: float = 0.0
    """When the helper's cut-σ2 activations arrived."""
    gradients_sent_s: float = 0.0
    """l + l′ as run ends: part 3 forward, loss, backward and the upload done."""
    gradients_s: float = 0.0
    """When the helper's cut-σ1 gradients arrived."""
    loss: float = 0.0
    correct: int = 0


class Client:
    """Parts 1 and 3 of one client, its optimizer over both, and its samples."""

    def __init__(self, part1: Stage, part3: Stage, optimizer, helper: str, helper_rank: int, samples, data,
                 batch: int) -> None:
        self.part1, self.part3, self.optimizer = part1, part3, optimizer
        self.helper, self.helper_rank, self.samples, self.data, self.batch = helper, helper_rank, samples, data, batch
        self.grad_outputs = [s for s in part1.outputs if s.carries_grad]
        self.grad_inputs = [s for s in part3.inputs if s.carries_grad]

    def run_batch(self, step: int) -> ClientBatch:
        x, y = self.data.take(self.samples.indices(step))
        acts, acts_work = _post_receives(self.part3.inputs, self.batch, self.helper_rank, step, ACTIVATIONS)
        grads, grads_work = _post_receives(self.grad_outputs, self.batch, self.helper_rank, step, GRADIENTS)
        out = ClientBatch(step, started_at=time.time())
        t0 = time.perf_counter()
        outputs = self.part1(x)
        wait_sent(_send([o.detach().contiguous() for o in outputs], self.helper, self.helper_rank, step, ACTIVATIONS))
        out.sent_s = time.perf_counter() - t0
        receive_from(self.helper, CARRIES[ACTIVATIONS], acts_work)
        out.activations_s = time.perf_counter() - t0
        for v, s in zip(acts, self.part3.inputs):
            v.requires_grad_(s.carries_grad)
        logits = self.part3(*acts)[0]
        loss = F.cross_entropy(logits, y)
        loss.backward()
        wait_sent(_send(_input_grads(acts, self.part3.inputs), self.helper, self.helper_rank, step, GRADIENTS))
        out.gradients_sent_s = time.perf_counter() - t0
        receive_from(self.helper, CARRIES[GRADIENTS], grads_work)
        out.gradients_s = time.perf_counter() - t0
        backward_into(outputs, self.part1.outputs, grads)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        out.completion_s = time.perf_counter() - t0
        out.loss = float(loss.detach())
        out.correct = int((logits.detach().argmax(dim=1) == y).sum())
        return out


@dataclass
class HelperBatch:
    step: int
    started_at: float = 0.0
    """Wall-clock time (time.time()) of the batch's start; the tasks' times count from it."""
    tasks: list[list] = field(default_factory=list)
    """[kind, client, start_s, end_s, ready_s] in the order run; start = the input had arrived and the
    helper was free; ready = when the helper learnt that the input was there (`ltf`; `plan` waits in
    order, so ready = start)."""


@dataclass
class _Copy:
    part2: Stage
    optimizer: object
    rank: int
    grad_outputs: list[TensorSpec]


class Arrivals:
    """Which posted receives have completed, as they complete: one waiter thread per task blocks in
    gloo's `wait()` (a gloo receive reports nothing to `is_completed()` before someone waits on it)
    and then queues the task, or the failure of its wait (naming the client); `take` hands them to
    the helper's thread, raising a failure there. (A failure raised in the waiter thread itself was
    printed as that thread's traceback, and the helper said only that no input came.)"""

    def __init__(self, received: dict, timeout_s: float) -> None:
        self._queue: queue.Queue = queue.Queue()
        self.timeout_s = timeout_s
        for task, (_, works) in received.items():
            threading.Thread(target=self._wait, args=(task, works), daemon=True).start()

    def _wait(self, task, works) -> None:
        kind, client = task
        try:
            receive_from(client, TASK_INPUT[kind], works)
        except RuntimeError as e:
            self._queue.put(e)
            return
        self._queue.put(task)

    def take(self, block: bool) -> list[tuple[tuple[str, str], float]]:
        """(task, now) for everything that arrived since the last call; with `block`, at least one.
        Stamped when the helper learns of it, so a record shows exactly what it knew when it chose."""
        out = []
        if block:
            try:
                out.append(self._queue.get(timeout=self.timeout_s))
            except queue.Empty:
                raise RuntimeFailure(f"no input reached the helper within {self.timeout_s:.0f} s") from None
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for item in out:
            if isinstance(item, BaseException):
                raise item
        now = time.perf_counter()
        return [(task, now) for task in out]


class Helper:
    """One part-2 copy (and optimizer) per assigned client; serves F and B tasks in the plan's order,
    or (`tails` given: the `ltf` order) the ready task with the most client work left after it."""

    def __init__(self, copies: dict[str, tuple[Stage, object, int]], order: list[tuple[str, str]], batch: int,
                 tails: dict[tuple[str, str], float] | None = None, timeout_s: float = 300.0) -> None:
        self.copies = {c: _Copy(stage, opt, rank, [s for s in stage.outputs if s.carries_grad])
                       for c, (stage, opt, rank) in copies.items()}
        self.order, self.batch, self.tails, self.timeout_s = order, batch, tails, timeout_s

    def run_batch(self, step: int) -> HelperBatch:
        self._received = {("F", c): _post_receives(k.part2.inputs, self.batch, k.rank, step, ACTIVATIONS)
                          for c, k in self.copies.items()}
        self._received.update({("B", c): _post_receives(k.grad_outputs, self.batch, k.rank, step, GRADIENTS)
                               for c, k in self.copies.items()})
        self._out, self._sends, self._saved, self._step = HelperBatch(step, started_at=time.time()), [], {}, step
        self._t0 = time.perf_counter()
        if self.tails is None:
            for task in self.order:
                kind, client = task
                receive_from(client, TASK_INPUT[kind], self._received[task][1])
                self._run(task, time.perf_counter())
        else:
            self._serve_largest_tail_first(Arrivals(self._received, self.timeout_s).take)
        wait_sent(self._sends)
        return self._out

    def _serve_largest_tail_first(self, take) -> None:
        """Whenever free: of the tasks whose input is there, the one with the largest tail (ties: the
        one known first); wait for an arrival only when none is. A B task's input (the client's
        gradients) cannot arrive before its F task ran, so readiness is all the rule needs."""
        left, ready = 2 * len(self.copies), {}
        while left:
            ready.update(take(block=not ready))
            task = max(ready, key=lambda t: (self.tails[t], -ready[t]))
            self._run(task, ready.pop(task))
            left -= 1

    def _run(self, task: tuple[str, str], ready: float) -> None:
        kind, client = task
        copy, step = self.copies[client], self._step
        tensors, _ = self._received.pop(task)
        start = time.perf_counter()
        if kind == "F":
            for v, s in zip(tensors, copy.part2.inputs):
                v.requires_grad_(s.carries_grad)
            outputs = copy.part2(*tensors)
            self._saved[client] = (tensors, outputs)
            self._sends += _send([o.detach().contiguous() for o in outputs], client, copy.rank, step, ACTIVATIONS)
        else:
            values, outputs = self._saved.pop(client)
            backward_into(outputs, copy.part2.outputs, tensors)
            self._sends += _send(_input_grads(values, copy.part2.inputs), client, copy.rank, step, GRADIENTS)
            copy.optimizer.step()
            copy.optimizer.zero_grad(set_to_none=True)
        t0 = self._t0
        self._out.tasks.append([kind, client, start - t0, time.perf_counter() - t0, min(ready, start) - t0])
        self._sends = [s for s in self._sends if not s.work.is_completed()]
