"""Interpret one device's schedule: a dispatch table from action kind to handler, nothing more.

The schedule (`hppctl.schedule`, docs/schedule.md) already decided every order; the executor runs
the device's list action by action:

| kind | handler |
|---|---|
| `F`    | inputs for the device's samples (the data for the head stage, else the received pieces joined in sample order), run the stage; the tail stage computes the loss |
| `B`    | the tail back-propagates its loss; other stages wait for the gradient pieces and back-propagate them through their outputs |
| `I`    | the same, to the stage's inputs only: their gradients, for `SG`; the weight gradients are deferred (runtime/split_backward.py) |
| `W`    | the deferred weight gradients of the micro-batch's `I`, accumulated into the parameters' gradients; frees its graph |
| `SA`   | post a non-blocking send of the activations of the named samples to the peer |
| `RA`   | post a non-blocking receive; the `F` of that micro-batch waits for it |
| `SG`   | post a non-blocking send of the input gradients of the named samples back to the peer |
| `RG`   | post a non-blocking receive; the `B` of that micro-batch waits for it |
| `AR`   | wait for this device's sends and for the gradient AllReduces the last `B` (or `W`) started, start the rest, and average the stage's BatchNorm statistics |
| `STEP` | wait for this device's sends, optimizer step, clear the gradients |

Gradients: the tail's loss for its samples is the summed cross-entropy divided by the *global*
batch G = M·B, so the gradients every device accumulates over its micro-batches, summed over the
stage's group by `AR`, are exactly the gradient of the mean loss over the global batch, whatever
the split (notes/asteroid.md §4: weighting by y_d).

Split backwards (zero-bubble schedules): `I` and `W` together accumulate exactly what `B` does,
parameter by parameter through autograd's AccumulateGrad, so everything below holds with `W` in
place of `B`. Only `Executor` runs them; its subclasses (Bi-Partition, asynchronous) refuse them.

Overlap (runtime/reducer.py): on a replicated stage, the device's last `B` (or `W`) of the round runs with
gradient hooks that start each 4 MiB bucket's AllReduce as soon as backward has produced it, so
the sum of the late layers travels while the early layers back-propagate; `AR` only waits for what
is still in flight. `RoundStats.allreduce_s` is that exposed wait (the buckets are spans of their own).

Every message carries a tag from (micro-batch, channel, tensor index); the schedule guarantees that
sends and receives between two devices come in the same order, and the tags check it.

Accelerators (runtime/accelerator.py): the stage computes on `accelerator` (a `torch.device`); data,
received pieces and AllReduce results come onto it through `from_wire`, and everything sent leaves
it through `to_wire` (gloo moves host memory). On the CPU both are the identity. `precision` wraps
the forward and the loss in its autocast, scales the tail's loss and unscales before `STEP`.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

import torch
import torch.nn.functional as F

from hppctl.errors import RuntimeFailure
from hppctl.models.reports import Span, allreduce_lane
from hppctl.models.schedule import Action
from hppctl.runtime.accelerator import Precision, from_wire, pinned_for, to_wire
from hppctl.runtime.reducer import BUCKET_BYTES, GradientReducer, unflatten_into
from hppctl.runtime.split_backward import DeferredWeights, backward_input, backward_weight
from hppctl.runtime.stage import Stage, TensorSpec, join
from hppctl.runtime.topology import Topology

ACTIVATIONS, GRADIENTS = 0, 1
CARRIES = {ACTIVATIONS: "activations", GRADIENTS: "gradients"}
"""What a channel's messages are, in the words of a failed wait (`naming`)."""
MAX_TENSORS_PER_CUT = 64


def tag(micro_batch: int, channel: int, index: int) -> int:
    return (micro_batch * 2 + channel) * MAX_TENSORS_PER_CUT + index


class Work(Protocol):
    def wait(self) -> object: ...
    def is_completed(self) -> bool: ...


class Comm(Protocol):
    """What the executor needs from torch.distributed (bootstrap.DistComm implements it)."""

    def isend(self, tensor: torch.Tensor, peer: str, tag: int) -> Work: ...
    def irecv(self, tensor: torch.Tensor, peer: str, tag: int) -> Work: ...
    def allreduce_sum(self, tensor: torch.Tensor) -> None: ...
    def allreduce_sum_async(self, tensor: torch.Tensor) -> Work:
        """Start a sum over the stage group; the result is in `tensor` once the work's wait returns.
        Every member must start its collectives in the same order (gloo pairs them by order)."""
    def allreduce_max(self, tensor: torch.Tensor) -> None: ...


class Feed(Protocol):
    """Inputs for the head stage and labels for the tail stage (data.SampleOrder behind it)."""

    def inputs(self, round_index: int, micro_batch: int, lo: int, hi: int) -> torch.Tensor: ...
    def labels(self, round_index: int, micro_batch: int, lo: int, hi: int) -> torch.Tensor: ...


class ExecutionError(RuntimeFailure):
    """An action failed; the message names the device, position and action, and shows the list around it."""


@dataclass
class RoundStats:
    round: int
    started_at: float = 0.0
    """Wall-clock time (time.time()) at the start of the round."""
    duration_s: float = 0.0
    compute_s: float = 0.0
    wait_s: float = 0.0
    allreduce_s: float = 0.0
    step_s: float = 0.0
    cpu_s: float = 0.0
    """CPU seconds of the whole worker process over the round (all threads; set by the worker)."""
    bytes_sent: int = 0
    loss: float = 0.0
    """Tail stage: this device's share of the mean loss over the global batch."""
    correct: int = 0
    samples: int = 0
    spans: list[Span] = field(default_factory=list)
    """Only with `--trace`."""


@dataclass
class _Pending:
    first: int
    samples: int
    tensors: list[torch.Tensor]
    works: list[Work]
    peer: str
    posted: float


@contextmanager
def naming(doing: str | Callable[[], str]) -> Iterator[None]:
    """A communication failure inside says what was being done with whom ("receiving activations
    from a"): a timeout or a reset there means that device (its process, host or link) stopped
    answering, and gloo's words name no peer — the waiting device alone would be blamed.
    hppctl's own failures (the fault-tolerant worker's PeerLost, Interrupted) pass unchanged.
    `doing` may be a function, asked only on a failure (what it says may need a look around)."""
    try:
        yield
    except RuntimeError as e:
        raise RuntimeError(f"{doing() if callable(doing) else doing}: {e}") from e


class AllReduceArrivals(Protocol):
    """Where the replicas of a stage say they reached a round's AllReduce (the worker's: the run's
    store), so that one whose AllReduce times out can name those that never did."""

    def reached(self, round_index: int) -> None: ...
    def missing(self, round_index: int, devices: Sequence[str]) -> list[str]: ...


def receive_from(peer: str, what: str, works: list[Work]) -> None:
    """Wait for receives posted to `peer`; their failure names the sender."""
    with naming(f"receiving {what} from {peer}"):
        for w in works:
            w.wait()


@dataclass
class Outgoing:
    """A posted send, kept until it completes: its tensor must live that long, and a failure of
    its wait names the receiver."""

    work: Work
    tensor: torch.Tensor
    peer: str
    what: str


def wait_sent(sends: Sequence[Outgoing]) -> None:
    """Wait for `sends`; a failure names the receiver (gloo sends once the receiver is ready for it)."""
    for s in sends:
        with naming(f"sending {s.what} to {s.peer}"):
            s.work.wait()


PREPOSTED = frozenset({"RA", "RG"})
"""Receive kinds posted at the start of a round (Executor._post_receives)."""
FINISHING = ("B", "W")
"""The kinds that complete a micro-batch's backward: its weight gradients are in after them."""


class Executor:
    """Runs rounds of one device's action list on its stage."""

    def __init__(self, device: str, actions: Sequence[Action], topology: Topology, stage: Stage,
                 optimizer: torch.optim.Optimizer, comm: Comm, feed: Feed, *, trace: bool = False,
                 accelerator: torch.device | None = None, precision: Precision | None = None,
                 bucket_bytes: int = BUCKET_BYTES, overlap_allreduce: bool = True) -> None:
        self.device, self.actions, self.topo, self.stage = device, list(actions), topology, stage
        self.optimizer, self.comm, self.feed, self.trace = optimizer, comm, feed, trace
        self.accelerator = accelerator or getattr(stage, "device", None) or torch.device("cpu")
        """Where the stage computes (`device` is the device's name in the plan)."""
        self.precision = precision or Precision("fp32", self.accelerator.type)
        self.pinned = pinned_for(self.accelerator)
        """Receive buffers page-locked (CUDA), so their copies onto the device overlap compute."""
        self.lo, self.hi = topology.owned[device]
        self.head, self.tail = topology.is_head(device), topology.is_tail(device)
        self.grad_inputs = [s for s in stage.inputs if s.carries_grad]
        self.grad_outputs = [s for s in stage.outputs if s.carries_grad]
        self.handlers: dict[str, Callable[[Action], None]] = {
            "F": self._forward, "B": self._backward,
            "SA": self._send_activations, "RA": self._receive_activations,
            "SG": self._send_gradients, "RG": self._receive_gradients,
            "AR": self._allreduce, "STEP": self._step,
        }
        if self.splits_backward:
            self.handlers.update({"I": self._backward_input, "W": self._backward_weight})
        self.handlers.update(self.more_handlers())
        self.backwards_per_round = sum(a.kind in FINISHING for a in self.actions)
        self.reducer = GradientReducer(stage.parameters(), comm, bucket_bytes=bucket_bytes,
                                       overlap=overlap_allreduce and self.overlaps_allreduce)
        self.last_backward = self._last_backward_before_allreduce()
        self.reduce_starts = self.last_backward if self.reducer.overlap else next(
            (a for a in self.actions if a.kind == "AR"), None)
        """The action before which this device takes part in the round's AllReduce: the last backward,
        whose gradient hooks start the buckets, or the `AR` itself."""
        self.arrivals: AllReduceArrivals | None = None
        """Set by the worker for a replicated stage: told when this device reaches each round's
        AllReduce (`reduce_starts`), asked on a timeout which of the others never did."""
        self.on_step: Callable[[int, int, int], None] | None = None
        """Called after each `B` or `W` with (round, backwards done, backwards per round): the
        worker's progress report (runtime/progress.py), for rounds long enough to need one."""
        unknown = sorted({a.kind for a in self.actions} - set(self.handlers))
        if unknown:
            raise ExecutionError(f"{device}: the schedule has actions of unknown kind {unknown}")

    splits_backward = True
    """Whether `I` and `W` run (a subclass with its own `B` refuses them as actions of unknown kind)."""

    overlaps_allreduce = True
    """Whether the last backward may start the AllReduce (a subclass whose backward does not
    accumulate into the live parameters' gradients turns it off)."""

    def _last_backward_before_allreduce(self) -> Action | None:
        """The `B` or `W` whose gradient hooks start the AllReduce: the device's last before its `AR`."""
        last = None
        for a in self.actions:
            if a.kind in FINISHING:
                last = a
            elif a.kind == "AR":
                return last
        return None

    def more_handlers(self) -> dict[str, Callable[[Action], None]]:
        """Handlers of further action kinds (runtime/bipartition.py's BiExecutor: SX, RX, SW, RW)."""
        return {}

    # --- the loop -------------------------------------------------------------------------------
    def run_round(self, round_index: int) -> RoundStats:
        self.round = round_index
        self.stats = RoundStats(round_index, started_at=time.time())
        self._t0 = time.perf_counter()
        self._inputs: dict[int, list[torch.Tensor]] = {}
        self._outputs: dict[int, tuple[torch.Tensor, ...]] = {}
        self._losses: dict[int, torch.Tensor] = {}
        self._input_grads: dict[int, list[torch.Tensor]] = {}
        self._deferred: dict[int, DeferredWeights] = {}
        self._recv_act: dict[int, list[_Pending]] = {}
        self._recv_grad: dict[int, list[_Pending]] = {}
        self._sends: list[Outgoing] = []
        self._post_receives()
        backwards = 0
        for position, action in enumerate(self.actions):
            if action.kind in PREPOSTED:
                continue
            if action is self.reduce_starts and self.arrivals is not None:
                self.arrivals.reached(round_index)
            try:
                self.handlers[action.kind](action)
            except ExecutionError:
                raise
            except Exception as e:
                raise ExecutionError(self._failure(position, e)) from e
            if action.kind in FINISHING and self.on_step is not None:
                backwards += 1
                self.on_step(round_index, backwards, self.backwards_per_round)
        self._wait_sends()
        if self._deferred:
            raise ExecutionError(f"{self.device}: round {round_index} ended with the `I` of micro-batches "
                                 f"{sorted(self._deferred)} and not their `W`")
        self.stats.duration_s = time.perf_counter() - self._t0
        return self.stats

    def _post_receives(self) -> None:
        """Post every receive of the round before the first action.

        Why: gloo moves a message only once its receive is posted (the sender waits for the
        receiver's ready notice). Posted at its place in the action list, just before the compute
        that needs it, a transfer could not overlap the compute before it, and every boundary
        added its transfer time to the pipeline's critical path (Env B lab: 0.8 s rounds where the
        simulator, which starts a transfer when the sender sends, predicted 0.58 s). The cost is
        one stage-input buffer per micro-batch, posted at once instead of as the round goes.
        """
        for position, action in enumerate(self.actions):
            if action.kind in PREPOSTED:
                try:
                    self.handlers[action.kind](action)
                except Exception as e:
                    raise ExecutionError(self._failure(position, e)) from e

    def _failure(self, position: int, error: Exception) -> str:
        window = range(max(0, position - 3), min(len(self.actions), position + 4))
        listing = " ".join(f"[{self.actions[i]}]" if i == position else str(self.actions[i]) for i in window)
        return (f"{self.device} (rank {self.topo.rank(self.device)}), round {self.round}, action {position} "
                f"{self.actions[position]}: {error.__class__.__name__}: {error} | actions: … {listing} …")

    # --- compute ------------------------------------------------------------------------------
    def _forward(self, a: Action) -> None:
        m = a.micro_batch
        self._check_range(a)
        if self.head:
            values = [self._data(m)]
        else:
            pieces = self._collect(self._recv_act.pop(m, []), a, "activations")
            values = join(self.stage.inputs, pieces)
            for v, spec in zip(values, self.stage.inputs):
                if spec.carries_grad:
                    v.requires_grad_(True)
        begin = time.perf_counter()
        with self.precision.autocast():
            outputs = self.stage(*values)
            if self.tail:
                logits = outputs[0]
                labels = self._labels_of(m)
                self._losses[m] = F.cross_entropy(logits, labels, reduction="sum") / self.topo.global_batch
        if self.tail:
            self.stats.loss += float(self._losses[m].detach())
            self.stats.correct += int((logits.detach().argmax(dim=1) == labels).sum())
            self.stats.samples += int(labels.shape[0])
        else:
            self._outputs[m] = outputs
        self._inputs[m] = values
        self._compute_span(a, begin)

    def _backward(self, a: Action) -> None:
        m = a.micro_batch
        self._check_range(a)
        hooks = self.reducer.hooked() if a is self.last_backward else nullcontext()
        roots, grads = self._backward_roots(a)
        begin = time.perf_counter()
        if roots:
            with hooks:
                torch.autograd.backward(roots, grads)
        values = self._inputs.pop(m)
        if not self.head:
            self._input_grads[m] = [v.grad if v.grad is not None else torch.zeros_like(v)
                                    for v, s in zip(values, self.stage.inputs) if s.carries_grad]
        self._compute_span(a, begin)

    def _backward_roots(self, a: Action) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """What micro-batch `a.micro_batch`'s backward starts from: the tail's (scaled) loss, or the
        outputs that need a gradient with the received ones (waited for here)."""
        m = a.micro_batch
        if self.tail:
            return [self.precision.scale(self._losses.pop(m))], [None]
        pieces = self._collect(self._recv_grad.pop(m, []), a, "gradients")
        grads = join(self.grad_outputs, pieces)
        outputs = [o for o, s in zip(self._outputs.pop(m), self.stage.outputs) if s.carries_grad]
        pairs = [(o, g.to(o.dtype)) for o, g in zip(outputs, grads) if o.requires_grad]  # autocast: o in half
        return [o for o, _ in pairs], [g for _, g in pairs]

    def _backward_input(self, a: Action) -> None:
        """`I`: the input gradients now (for `SG`), the weight gradients kept for the `W`."""
        m = a.micro_batch
        self._check_range(a)
        roots, grads = self._backward_roots(a)
        begin = time.perf_counter()
        carried = [v for v, s in zip(self._inputs.pop(m), self.stage.inputs) if s.carries_grad]
        got, self._deferred[m] = backward_input(roots, grads, carried, self.stage.parameters())
        if not self.head:
            self._input_grads[m] = [g if g is not None else torch.zeros_like(v) for g, v in zip(got, carried)]
        self._compute_span(a, begin)

    def _backward_weight(self, a: Action) -> None:
        """`W`: accumulate the weight gradients its `I` deferred (the last before `AR` with the
        reducer's hooks, like a last `B`); the micro-batch's graph is freed once they are in."""
        self._check_range(a)
        deferred = self._deferred.pop(a.micro_batch, None)
        if deferred is None:
            raise ExecutionError(f"{self.device}: {a} comes before the `I` of micro-batch {a.micro_batch}")
        begin = time.perf_counter()
        with self.reducer.hooked() if a is self.last_backward else nullcontext():
            backward_weight(deferred)
        self._compute_span(a, begin)

    def _data(self, m: int) -> torch.Tensor:
        """The inputs of micro-batch `m`'s samples of this device, on its accelerator."""
        return from_wire(self.feed.inputs(self.round, m, self.lo, self.hi), self.accelerator)

    def _labels_of(self, m: int) -> torch.Tensor:
        return from_wire(self.feed.labels(self.round, m, self.lo, self.hi), self.accelerator)

    def _check_range(self, a: Action) -> None:
        if (a.start, a.end) != (self.lo, self.hi):
            raise ExecutionError(f"{self.device}: {a} does not cover the device's samples [{self.lo}:{self.hi})")

    def _compute_span(self, a: Action, begin: float) -> None:
        now = time.perf_counter()
        self.stats.compute_s += now - begin
        self._span(str(a), "forward" if a.kind == "F" else "backward", self.device, begin, now,
                   {"micro_batch": a.micro_batch})

    # --- transfers ----------------------------------------------------------------------------
    def _send_activations(self, a: Action) -> None:
        outputs = self._outputs[a.micro_batch]
        tensors = [to_wire(s.rows_of(o.detach(), a.start - self.lo, a.end - self.lo).contiguous(), s.dtype)
                   for o, s in zip(outputs, self.stage.outputs)]
        self._send(a, tensors, ACTIVATIONS)

    def _send_gradients(self, a: Action) -> None:
        grads = self._input_grads[a.micro_batch]
        tensors = [to_wire(s.rows_of(g, a.start - self.lo, a.end - self.lo).contiguous(), s.dtype)
                   for g, s in zip(grads, self.grad_inputs)]
        self._send(a, tensors, GRADIENTS)

    def _send(self, a: Action, tensors: list[torch.Tensor], channel: int) -> None:
        for i, t in enumerate(tensors):
            self.post_send(t, a.peer, tag(a.micro_batch, channel, i), CARRIES[channel])
        self._sends = [s for s in self._sends if not s.work.is_completed()]

    def post_send(self, tensor: torch.Tensor, peer: str, message_tag: int, what: str) -> None:
        """Start sending `tensor` to `peer`; `_wait_sends` (at `AR`, `STEP` and the round's end) waits for it."""
        self._sends.append(Outgoing(self.comm.isend(tensor, peer, message_tag), tensor, peer, what))
        self.stats.bytes_sent += tensor.numel() * tensor.element_size()

    def _receive_activations(self, a: Action) -> None:
        specs = self.stage.inputs
        self._recv_act.setdefault(a.micro_batch, []).append(self._receive(a, specs, ACTIVATIONS))

    def _receive_gradients(self, a: Action) -> None:
        self._recv_grad.setdefault(a.micro_batch, []).append(self._receive(a, self.grad_outputs, GRADIENTS))

    def _receive(self, a: Action, specs: Sequence[TensorSpec], channel: int) -> _Pending:
        tensors = [s.empty(a.end - a.start, self.pinned) for s in specs]
        works = [self.comm.irecv(t, a.peer, tag(a.micro_batch, channel, i)) for i, t in enumerate(tensors)]
        return _Pending(a.start, a.end - a.start, tensors, works, a.peer, time.perf_counter())

    def _collect(self, pending: list[_Pending], a: Action, what: str) -> list[tuple[int, list[torch.Tensor]]]:
        """Wait for the pieces of micro-batch `a.micro_batch`; they must tile the device's samples."""
        covered = sorted((p.first, p.first + p.samples) for p in pending)
        position = self.lo
        for lo, hi in covered:
            if lo != position:
                break
            position = hi
        if position != self.hi or not covered:
            raise ExecutionError(f"{self.device}: {a} found {what} for {covered}, needs [{self.lo}:{self.hi})")
        begin = time.perf_counter()
        for p in pending:
            receive_from(p.peer, what, p.works)
            done = time.perf_counter()
            self._span(f"{a.micro_batch}{'A' if what == 'activations' else 'G'}[{p.first}:{p.first + p.samples}]",
                       what, f"{p.peer}->{self.device}", p.posted, done, {"micro_batch": a.micro_batch})
        now = time.perf_counter()
        self.stats.wait_s += now - begin
        if now - begin > 1e-4:
            self._span(f"wait {a}", "wait", self.device, begin, now)
        return [(p.first, [from_wire(t, self.accelerator) for t in p.tensors]) for p in pending]

    # --- group ----------------------------------------------------------------------------------
    def _wait_sends(self) -> None:
        begin = time.perf_counter()
        wait_sent(self._sends)
        self._sends = []
        self.stats.wait_s += time.perf_counter() - begin

    def _allreduce(self, a: Action) -> None:
        """The exposed part of the AllReduce: what the last backward's buckets left to wait for."""
        self._wait_sends()
        begin = time.perf_counter()
        stage = self.topo.stage_of[self.device]
        with naming(lambda: self._reducing_with(stage)):
            buckets = self.reducer.finish()
            self._average_buffers()
        now = time.perf_counter()
        self.stats.allreduce_s += now - begin
        self._span(str(a), "allreduce", self.device, begin, now, {"buckets": len(buckets)})
        for b in buckets:  # each bucket from its start (maybe within the last backward) to its sum
            self._span(f"{a} bucket {b.bucket}", "allreduce", allreduce_lane(self.device), b.started, min(b.ended),
                       {"bucket": b.bucket, "bytes": b.flat.numel() * b.flat.element_size()})

    def _reducing_with(self, stage: int) -> str:
        """What a failed AllReduce was doing, naming the replicas that never reached it when the
        arrivals say (gloo's timeout names no one; any of the others may be the silent one)."""
        others = [d for d in self.topo.groups[stage] if d != self.device]
        doing = f"all-reducing stage {stage}'s gradients with {', '.join(others)}"
        absent = self.arrivals.missing(self.round, others) if self.arrivals is not None else []
        return f"{doing} ({', '.join(absent)} never reached it)" if absent else doing

    def _average_buffers(self) -> None:
        """BatchNorm running statistics: each replica saw only its own samples; after the round the
        group keeps their average weighted by samples (y_d / B), and the largest batch counter."""
        buffers = [b for b in self.stage.module.buffers()]
        floats = [b for b in buffers if b.dtype.is_floating_point]
        ints = [b for b in buffers if not b.dtype.is_floating_point]
        weight = self.topo.samples[self.device] / self.topo.micro_batch
        if floats:
            flat = to_wire(torch.cat([b.reshape(-1) for b in floats]) * weight)
            self.comm.allreduce_sum(flat)
            unflatten_into(flat, floats)
        if ints:
            flat = to_wire(torch.cat([b.reshape(-1) for b in ints]))
            self.comm.allreduce_max(flat)
            unflatten_into(flat, ints)

    def _step(self, a: Action) -> None:
        self._wait_sends()
        begin = time.perf_counter()
        if self.precision.unscale(self.stage.parameters()):  # fp16: False on an overflow, the step skipped
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        now = time.perf_counter()
        self.stats.step_s += now - begin
        self._span(str(a), "step", self.device, begin, now)

    def _span(self, name: str, category: str, track: str, begin: float, end: float, args: dict | None = None) -> None:
        if self.trace:
            self.stats.spans.append(Span(name=name, category=category, track=track, start_s=begin - self._t0,
                                         duration_s=end - begin, args=args or {}))

