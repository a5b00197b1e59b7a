"""Split backwards (runtime/split_backward.py): `I` + `W` equal a fused backward, on every training model.

For each training model of the zoo, three stages (head, a middle one, tail) run three micro-batches
in the order I0 I1 W0 I2 W1 W2 against B0 B1 B2 on a copy of the same stage: each `I`'s input
gradients equal the fused backward's, `I` accumulates nothing, each `W` brings every parameter's
`.grad` to the fused backward's after the same micro-batches. Output gradients of the head and
middle stages are fixed random tensors (the equivalence does not depend on them); the tail's
roots are its loss. Dropout draws the same masks in both runs (seeded before every forward).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hppctl.runtime.accelerator import Precision
from hppctl.runtime.data import load_data
from hppctl.runtime.split_backward import backward_input, backward_weight, graph_node
from hppctl.runtime.stage import Stage, initial_stage_tensors
from hppctl.zoo import get_model, layer_costs
from hppctl.zoo.catalog import builtin_names

TRAINING = [name for name in builtin_names() if get_model(name).task == "train"]
BATCH = 2
MICRO_BATCHES = 3


def thirds(model: str) -> list[tuple[int, int]]:
    n = len(layer_costs(model, "fine"))
    return [(0, n // 3), (n // 3, 2 * n // 3), (2 * n // 3, n)]


class Chain:
    """A model's three stages, each with the inputs it receives for every micro-batch."""

    def __init__(self, model: str, precision: Precision = Precision()) -> None:
        self.model, self.precision = model, precision
        cuts = thirds(model)  # the whole model built once, as the launcher does
        self.stages = [Stage(model, "fine", lo, hi, tensors=tensors)
                       for (lo, hi), tensors in zip(cuts, initial_stage_tensors(model, "fine", cuts, seed=1))]
        data = load_data("synthetic", model)
        x, self.labels = data.train.take(torch.arange(BATCH * MICRO_BATCHES))
        self.inputs: list[list[list[torch.Tensor]]] = []
        values = [[x[m * BATCH:(m + 1) * BATCH]] for m in range(MICRO_BATCHES)]
        for stage in self.stages:
            self.inputs.append(values)
            with torch.no_grad():
                torch.manual_seed(5)
                values = [[t.detach() for t in stage(*v)] for v in values]

    def labels_of(self, m: int) -> torch.Tensor:
        return self.labels[m * BATCH:(m + 1) * BATCH]


def forward(chain: Chain, p: int, stage: Stage, m: int):
    """Leaf inputs of micro-batch m, and the roots and their gradients to back-propagate."""
    values = [v.clone().requires_grad_(p > 0 and s.carries_grad) for v, s in zip(chain.inputs[p][m], stage.inputs)]
    torch.manual_seed(100 + m)
    with chain.precision.autocast():
        outputs = stage(*values)
        if p == len(chain.stages) - 1:
            loss = F.cross_entropy(outputs[0], chain.labels_of(m), reduction="sum") / (BATCH * MICRO_BATCHES)
            return values, [chain.precision.scale(loss)], [None]
    roots = [o for o, s in zip(outputs, stage.outputs) if s.carries_grad and o.requires_grad]
    generator = torch.Generator().manual_seed(200 + m)
    return values, roots, [torch.randn(o.shape, generator=generator).to(o.dtype) for o in roots]


def grads(stage: Stage) -> dict[str, torch.Tensor | None]:
    return {k: None if p.grad is None else p.grad.clone() for k, p in stage.module.named_parameters()}


def fused(chain: Chain, p: int) -> tuple[list[list[torch.Tensor | None]], list[dict]]:
    """Input gradients of each micro-batch and the parameters' gradients after each, with `B`."""
    stage = chain.stages[p]
    stage.module.zero_grad(set_to_none=True)
    inputs, after = [], []
    for m in range(MICRO_BATCHES):
        values, roots, root_grads = forward(chain, p, stage, m)
        torch.autograd.backward(roots, root_grads)
        inputs.append([v.grad for v in values])
        after.append(grads(stage))
    return inputs, after


def split(chain: Chain, p: int, check_input, check_params) -> None:
    """I0 I1 W0 I2 W1 W2 from no gradients, checking against the fused run as it goes (the forwards
    update BatchNorm's running statistics, which a training-mode forward does not read)."""
    stage = chain.stages[p]
    stage.module.zero_grad(set_to_none=True)
    deferred = {}
    for kind, m in (("I", 0), ("I", 1), ("W", 0), ("I", 2), ("W", 1), ("W", 2)):
        if kind == "I":
            before = grads(stage)
            values, roots, root_grads = forward(chain, p, stage, m)
            got, deferred[m] = backward_input(roots, root_grads, values, stage.parameters())
            check_input(m, got)
            assert all(v.grad is None for v in values)
            assert_same(grads(stage), before)  # `I` accumulates nothing
        else:
            backward_weight(deferred.pop(m))
            check_params(m, grads(stage))


def assert_same(actual: dict, expected: dict, **tolerance) -> None:
    assert actual.keys() == expected.keys()
    for name, want in expected.items():
        if want is None:
            assert actual[name] is None, name
        else:
            torch.testing.assert_close(actual[name], want, msg=lambda msg: f"{name}: {msg}", **tolerance)


@pytest.mark.parametrize("model", TRAINING)
def test_input_then_weight_halves_equal_the_fused_backward(model):
    chain = Chain(model)
    for p in range(len(chain.stages)):
        want_inputs, want_params = fused(chain, p)

        def check_input(m, got):
            assert len(got) == len(want_inputs[m])
            for g, want in zip(got, want_inputs[m]):
                if want is None:  # the head's data, or an input the stage does not differentiate
                    assert g is None
                else:
                    torch.testing.assert_close(g, want)

        split(chain, p, check_input, lambda m, got: assert_same(got, want_params[m]))
        assert any(g is not None for g in want_params[-1].values())


@pytest.mark.parametrize("mode", ["bf16", "fp16"])
@pytest.mark.parametrize("model", ["tiny-cnn", "tiny-bert"])
def test_mixed_precision(model, mode):
    """Autocast (and fp16's loss scale on the tail's root): the halves equal `B` under the same precision."""
    chain = Chain(model, Precision(mode, "cpu"))
    for p in range(len(chain.stages)):
        want_inputs, want_params = fused(chain, p)
        split(chain, p,
              lambda m, got: [torch.testing.assert_close(g, w) for g, w in zip(got, want_inputs[m]) if w is not None],
              lambda m, got: assert_same(got, want_params[m]))


def test_the_weight_half_does_not_redo_the_input_half():
    """Autograd node executions: `W` runs each node at most once, and of the nodes `I` ran (the input
    path), only those a weight gradient hangs off (a convolution's, a linear's); `I` runs none of the
    parameters' AccumulateGrad nodes. So I + W is one backward's work, not two."""
    chain = Chain("mobilenetv2")
    p = 1
    stage = chain.stages[p]
    values, roots, root_grads = forward(chain, p, stage, 0)
    nodes = reachable([graph_node(r) for r in roots])
    runs: list[tuple[str, object]] = []
    phase = ["I"]
    handles = [n.register_prehook(lambda _g, n=n: runs.append((phase[0], n))) for n in nodes]
    _, deferred = backward_input(roots, root_grads, values, stage.parameters())
    phase[0] = "W"
    backward_weight(deferred)
    for h in handles:
        h.remove()
    in_i = [n for ph, n in runs if ph == "I"]
    in_w = [n for ph, n in runs if ph == "W"]
    params = {graph_node(q) for q in stage.parameters()}
    assert not params & set(in_i)
    assert len(in_w) == len(set(in_w))
    redone = [n for n in set(in_i) & set(in_w) if not any(c in params or c not in set(in_i)
                                                          for c, _ in n.next_functions if c is not None)]
    assert not redone, [type(n).__name__ for n in redone]
    assert params <= set(in_w)  # every parameter's gradient accumulated in `W`
    assert len(set(in_i) & set(in_w)) < len(set(in_i)) / 2


def reachable(roots):
    seen, stack = set(roots), list(roots)
    while stack:
        for child, _ in stack.pop().next_functions:
            if child is not None and child not in seen:
                seen.add(child)
                stack.append(child)
    return seen


def test_only_the_plain_executor_runs_split_backwards():
    """Bi-Partition's and the asynchronous executors refuse `I` and `W` as before: actions of unknown
    kind. (The fault-tolerant worker runs the plain executor: tests/runtime/test_schedule_matrix.py.)"""
    from hppctl.runtime.async_exec.executor import AsyncExecutor
    from hppctl.runtime.bipartition import BiExecutor, BiStage
    from hppctl.runtime.executor import ExecutionError, Executor
    from hppctl.runtime.topology import Topology
    from hppctl.schedule import schedule_for_plan
    from tests.runtime.factories import make_plan
    from tests.runtime.split_schedules import split_backwards

    plan = make_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 5), ["b", "c"], [2, 2])], global_batch=8, micro_batch=4)
    schedule = split_backwards(schedule_for_plan(plan), "before AR")
    topo, actions = Topology.of(schedule), schedule.actions["b"]

    def stage():
        return Stage("tiny-mlp", "fine", 2, 5)

    def optimizer(st):
        return torch.optim.SGD(st.parameters(), lr=0.1)

    st = stage()
    plain = Executor("b", actions, topo, st, optimizer(st), None, None)
    assert plain.handlers.keys() >= {"I", "W"}
    assert plain.backwards_per_round == 2  # progress counts the W of each micro-batch (I alone is not done)
    assert plain.last_backward == next(a for a in reversed(actions) if a.kind == "W")  # the reducer's hooks
    refused = {
        "BiExecutor": lambda: BiExecutor("b", actions, topo, bi, optimizer(bi), None, None),
        "AsyncExecutor": lambda: AsyncExecutor("b", actions, topo, st, optimizer(st), None, None, policy="nf1b",
                                               micro_batches_per_update=2),
    }
    bi = BiStage("tiny-mlp", "fine", [2, 5], [2, 5], num_layers=5)
    for build in refused.values():
        with pytest.raises(ExecutionError, match=r"unknown kind \['I', 'W'\]"):
            build()


def test_the_graph_lives_until_its_weight_half_and_no_longer():
    """What `W` needs (a layer's saved input) stays alive after `I`, and is freed once `W` is done,
    so memory stays bounded however many micro-batches a schedule keeps between their halves."""
    import weakref

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    saved = []
    model[2].register_forward_hook(lambda _m, args, _out: saved.append(weakref.ref(args[0])))
    x = torch.randn(5, 4, requires_grad=True)
    out = model(x)
    grad_x, deferred = backward_input([out], [torch.ones_like(out)], [x], list(model.parameters()))
    del out
    assert grad_x[0] is not None and saved[0]() is not None  # W's input of the last Linear
    backward_weight(deferred)
    assert saved[0]() is None
    assert all(p.grad is not None for p in model.parameters())


class Awkward(torch.nn.Module):
    """Graph shapes the zoo's stages do not have: a weight used twice along the input path (tied:
    its two seeds reach one another), a parameter reaching an output that no input reaches, an
    output that is an input passed through, a parameter the graph never uses."""

    def __init__(self) -> None:
        super().__init__()
        self.tied = torch.nn.Linear(6, 6)
        self.offset = torch.nn.Parameter(torch.randn(6))
        self.unused = torch.nn.Parameter(torch.randn(2))

    def forward(self, x, skip, ids):
        h = self.tied(torch.tanh(self.tied(x)) + self.offset)
        return h * skip, self.offset.expand(ids.shape[0], 6) * 3, skip


def test_awkward_graphs():
    torch.manual_seed(0)
    module = Awkward()
    params = list(module.parameters())
    x, skip, ids = torch.randn(4, 6), torch.randn(4, 6), torch.arange(4)
    gen = torch.Generator().manual_seed(1)
    out_grads = [torch.randn(4, 6, generator=gen) for _ in range(3)]

    def leaves():
        return [x.clone().requires_grad_(True), skip.clone().requires_grad_(True), ids]

    want_params, want_inputs = {}, []
    for m in range(2):  # two micro-batches: .grad accumulates
        values = leaves()
        torch.autograd.backward(list(module(*values)), out_grads)
        want_inputs.append([v.grad for v in values[:2]])
        want_params[m] = grads_of(module)
    module.zero_grad(set_to_none=True)
    deferred = []
    for m in range(2):
        values = leaves()
        got, later = backward_input(list(module(*values)), out_grads, values, params)
        for g, want in zip(got, want_inputs[m]):
            torch.testing.assert_close(g, want)
        assert got[2] is None
        deferred.append(later)
    clamped = any(call.clamped for call in deferred[0].calls)
    for m in range(2):
        backward_weight(deferred[m])
        assert_same(grads_of(module), want_params[m])
    assert module.unused.grad is None
    assert clamped  # the tied weight's two seeds: one call, each pinned to its captured gradient


def grads_of(module: torch.nn.Module) -> dict:
    return {k: None if p.grad is None else p.grad.clone() for k, p in module.named_parameters()}
