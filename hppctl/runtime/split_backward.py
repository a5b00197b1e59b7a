"""A stage's backward in two halves: `I` (input gradients now) and `W` (weight gradients later).

Zero-bubble schedules (ZB-H1's idea; models/schedule.py, the pairing contract) split each backward:
the upstream stage waits only for the gradients of this stage's inputs, so `I` computes those and
nothing else, and `W`, placed where the device would otherwise wait, computes the weight gradients.
The idea is torch's own (torch/distributed/pipelining/_backward.py, stage_backward_input/weight);
this is a compact version that also covers parameters whose gradient does not pass the input path,
accumulates through autograd (so post-accumulate-grad hooks fire: the overlapped AllReduce,
runtime/reducer.py) and calls autograd once per independent parameter group.

The autograd graph of one micro-batch, seen from the stage's roots (its outputs, or the tail's loss):

- the *input path*: the nodes from which a stage input is reachable. `I` runs exactly these, with
  `torch.autograd.grad(..., inputs=stage inputs, retain_graph=True)`: a convolution's node then
  computes its input gradient only (autograd asks a node only for the outputs some input needs).
- the *weight branches*: the rest of the graph that leads to a parameter (the parameters'
  AccumulateGrad nodes, the casts of autocast, a Linear's transpose...). Each hangs off the input
  path at a node (a *seed*: the convolution's own node, whose weight output was left out), or off a
  root that does not reach the inputs (the head stage, whose inputs need no gradient: there every
  branch hangs off the roots, `I` does nothing and `W` is the whole backward).

`I` registers a prehook on every seed, so the full gradient that reaches it is captured as it
passes. `W` back-propagates those captured gradients (and the roots' own gradients, for branches
hanging off the roots) into the parameters only: it starts at the seeds with their captured
gradients, and autograd runs only the weight branches. It never redoes the input path, provided
a call's seeds do not reach each other's parameters along it, which is why there is one autograd
call per parameter group (seeds sharing a parameter: a tied weight, an autocast cast reused).
Within a group whose seeds do reach one another, prehooks clamp each seed to its captured
gradient (so nothing counts twice), at the price of recomputing that stretch of the input path.

Each parameter is reached by exactly one call, so its AccumulateGrad runs once per micro-batch, as
in a fused backward: `.grad` sums over micro-batches the same way, and the reducer's hooks see a
parameter ready once. `W` keeps the graph (retain_graph) across its calls; dropping the returned
`DeferredWeights` when `W` is done frees it (and the captured gradients).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch.autograd.graph import GradientEdge, Node


@dataclass
class WeightCall:
    """One autograd call of `W`: seeds (nodes, with the gradients to start them from) and the
    parameters it accumulates into. `clamped`: seeds that may be reached from another seed of the
    call, pinned to their captured gradients."""

    seeds: list[tuple[Node, int, torch.Tensor]] = field(default_factory=list)
    params: list[torch.Tensor] = field(default_factory=list)
    clamped: dict[Node, tuple] = field(default_factory=dict)


@dataclass
class DeferredWeights:
    """What `I` leaves for `W`: the weight-gradient calls, in the order backward reaches them."""

    calls: list[WeightCall]

    @property
    def autograd_calls(self) -> int:
        return len(self.calls)


def graph_node(t: torch.Tensor) -> Node | None:
    """The node back-propagating into `t`: its grad_fn, or a leaf's AccumulateGrad (made on demand,
    through a view: autograd creates it lazily and gives Python no other handle)."""
    if t.grad_fn is not None or not t.requires_grad:
        return t.grad_fn
    with torch.enable_grad():
        return t.view_as(t).grad_fn.next_functions[0][0]


def _edge_of(t: torch.Tensor) -> tuple[Node, int] | None:
    node = graph_node(t)
    if node is None:
        return None
    return node, (t.output_nr if t.grad_fn is not None else 0)


class _Graph:
    """The nodes reachable from the roots, in breadth-first order (output side first), with each
    node's parents and which of them lie on the input path."""

    def __init__(self, roots: Sequence[Node], inputs: Sequence[Node]) -> None:
        self.order: list[Node] = []
        self.parents: dict[Node, list[Node]] = {}
        queue = deque()
        for node in roots:
            if node not in self.parents:
                self.parents[node] = []
                self.order.append(node)
                queue.append(node)
        while queue:
            node = queue.popleft()
            for child, _ in node.next_functions:
                if child is None:
                    continue
                if child not in self.parents:
                    self.parents[child] = []
                    self.order.append(child)
                    queue.append(child)
                self.parents[child].append(node)
        self.on_input_path = self._upwards([n for n in inputs if n in self.parents])

    def _upwards(self, start: Sequence[Node], within: set[Node] | None = None) -> set[Node]:
        """`start` and every node from which one of them is reachable (inside `within`, if given)."""
        seen = set(start)
        queue = deque(start)
        while queue:
            for parent in self.parents[queue.popleft()]:
                if parent not in seen and (within is None or parent in within):
                    seen.add(parent)
                    queue.append(parent)
        return seen

    def weight_branches(self, params: Sequence[Node]) -> set[Node]:
        """The nodes off the input path that lead to a parameter (the parameters' nodes included)."""
        off_path = set(self.parents) - self.on_input_path
        return self._upwards([p for p in params if p in off_path], off_path)


class _Groups:
    """Union-find of seeds over the parameters they reach: one autograd call per group."""

    def __init__(self) -> None:
        self.parent: dict[object, object] = {}

    def find(self, x: object) -> object:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: object, b: object) -> None:
        self.parent[self.find(a)] = self.find(b)


EAGER_NODES = frozenset({"NativeBatchNormBackward0", "CudnnBatchNormBackward0", "MiopenBatchNormBackward0"})
"""Nodes whose weight gradients `I` computes at once: a training-mode BatchNorm's input gradient
needs the sums over the batch of dy and of dy·x̂, which *are* the gradients of its bias and weight,
so its kernel computes them whatever autograd asks (measured: deferring them doubled the BatchNorm
backward, the larger half of mobilenetv2's). `I` returns them and `W` only accumulates them."""


def backward_input(roots: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None],
                   inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor]
                   ) -> tuple[list[torch.Tensor | None], DeferredWeights]:
    """`I`: the gradients of `inputs` (None where none reaches one) from `roots` back-propagated
    with `grads` (None: a scalar root such as the loss, gradient 1), and what `W` needs later.
    Nothing accumulates into any `.grad`."""
    live = [(r, g if g is not None else torch.ones_like(r)) for r, g in zip(roots, grads) if r.requires_grad]
    root_edges = [_edge_of(r) for r, _ in live]
    wanted = [v for v in inputs if v.requires_grad]
    if not wanted:  # the head stage: no input needs a gradient, `W` is the whole backward
        whole = WeightCall([(*_edge_of(r), g) for r, g in live], [p for p in params if p.requires_grad])
        return [None] * len(inputs), DeferredWeights([whole] if whole.seeds and whole.params else [])
    graph = _Graph([n for n, _ in root_edges], [graph_node(v) for v in wanted])
    param_nodes = {graph_node(p): p for p in params if p.requires_grad}
    branches = graph.weight_branches(list(param_nodes))
    seeds = [n for n in graph.order if n in graph.on_input_path
             and any(c in branches for c, _ in n.next_functions if c is not None)]
    hanging = [(node, nr, g) for (node, nr), (_, g) in zip(root_edges, live) if node in branches]
    groups = _group(seeds, hanging, branches, param_nodes)
    eager = [g for g in groups if g.eager]
    eager_params = [param_nodes[p] for g in eager for p in g.params]
    captured: dict[Node, tuple] = {}
    handles = [seed.register_prehook(_capture(captured, seed)) for g in groups if not g.eager for seed in g.seeds]
    try:
        reaching = [(r, g) for (r, g), (node, _) in zip(live, root_edges) if node in graph.on_input_path]
        got = _autograd_grad(reaching, wanted + eager_params)
    finally:
        for h in handles:
            h.remove()
    by_input = dict(zip(map(id, wanted), got))
    calls = [_deferred_call(g, captured, param_nodes) for g in groups if not g.eager]
    accumulate = WeightCall()
    for p, dp in zip(eager_params, got[len(wanted):]):
        if dp is not None:
            accumulate.seeds.append((graph_node(p), 0, dp))
            accumulate.params.append(p)
    calls = ([accumulate] if accumulate.seeds else []) + [c for c in calls if c.seeds]
    return [by_input.get(id(v)) for v in inputs], DeferredWeights(calls)


@dataclass
class _Group:
    """Seeds that reach common parameters (so one autograd call), and those parameters' nodes."""

    seeds: list[Node] = field(default_factory=list)
    roots: list[tuple[Node, int, torch.Tensor]] = field(default_factory=list)
    params: list[Node] = field(default_factory=list)

    @property
    def eager(self) -> bool:
        return not self.roots and all(type(s).__name__ in EAGER_NODES for s in self.seeds)


def _group(seeds: list[Node], hanging: list[tuple[Node, int, torch.Tensor]], branches: set[Node],
           param_nodes: dict[Node, torch.Tensor]) -> list[_Group]:
    """Seeds (nodes of the input path, roots hanging weight branches) grouped by the parameters they
    reach, in graph order (output side first): each parameter is reached from one group only."""
    union = _Groups()
    starts = [(seed, [c for c, _ in seed.next_functions if c is not None and c in branches]) for seed in seeds]
    starts += [((node, nr), [node]) for node, nr, _ in hanging]
    reached = {}
    for key, below in starts:
        reached[key] = _params_below(below, branches, param_nodes)
        for p in reached[key]:
            union.union(key, p)
    groups: dict[object, _Group] = {}
    hung = {(node, nr): g for node, nr, g in hanging}
    for key, _ in starts:
        if not reached[key]:
            continue
        group = groups.setdefault(union.find(key), _Group())
        if key in hung:
            group.roots.append((*key, hung[key]))
        else:
            group.seeds.append(key)
        group.params += [p for p in reached[key] if p not in group.params]
    return list(groups.values())


def _capture(captured: dict[Node, tuple], seed: Node):
    def hook(grad_outputs: tuple) -> None:
        captured[seed] = grad_outputs
    return hook


def _autograd_grad(reaching: list[tuple[torch.Tensor, torch.Tensor]], wanted: list[torch.Tensor]
                   ) -> list[torch.Tensor | None]:
    if not wanted or not reaching:
        return [None] * len(wanted)
    return list(torch.autograd.grad([r for r, _ in reaching], wanted, [g for _, g in reaching],
                                    retain_graph=True, allow_unused=True))


def _deferred_call(group: _Group, captured: dict[Node, tuple], param_nodes: dict[Node, torch.Tensor]) -> WeightCall:
    """A group's `W` call: its seeds started from their captured gradients (a seed autograd never
    reached gets no gradient there, as in a fused backward), its roots from theirs."""
    call = WeightCall(params=[param_nodes[p] for p in group.params])
    for seed in group.seeds:
        if seed in captured:
            call.seeds += [(seed, i, g) for i, g in enumerate(captured[seed]) if g is not None]
            call.clamped[seed] = captured[seed]
    call.seeds += group.roots
    if len(call.clamped) < 2:
        call.clamped = {}
    return call


def _params_below(start: list[Node], branches: set[Node], param_nodes: dict[Node, torch.Tensor]) -> list[Node]:
    seen, queue, found = set(start), deque(start), []
    while queue:
        node = queue.popleft()
        if node in param_nodes:
            found.append(node)
        for child, _ in node.next_functions:
            if child is not None and child in branches and child not in seen:
                seen.add(child)
                queue.append(child)
    return found


def backward_weight(deferred: DeferredWeights) -> None:
    """`W`: accumulate the deferred weight gradients into the parameters' `.grad`, through autograd
    (AccumulateGrad runs, so post-accumulate-grad hooks fire), one call per parameter group."""
    # A clamped call re-runs part of the input path, where other calls' seeds may lie, so the
    # clamped calls run first and keep the graph. Every other call runs nodes no other call runs
    # (each seed and each weight branch belongs to one group) and frees them as it goes: keeping
    # them made the head's W (its whole backward) 1.3x slower than `B` at batch 64 on mobilenetv2.
    pending = [c for c in deferred.calls if c.clamped] + [c for c in deferred.calls if not c.clamped]
    deferred.calls = []
    while pending:
        call = pending.pop(0)  # dropped once run: the captured gradients, and the graph with the last
        handles = [node.register_prehook(lambda _grads, saved=saved: saved) for node, saved in call.clamped.items()]
        try:
            torch.autograd.backward([GradientEdge(node, nr) for node, nr, _ in call.seeds],
                                    [g for _, _, g in call.seeds], retain_graph=bool(call.clamped),
                                    inputs=call.params)
        finally:
            for h in handles:
                h.remove()
