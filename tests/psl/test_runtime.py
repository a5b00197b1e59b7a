"""`hppctl psl run`: clients and helpers as gloo worker processes on this machine.

One run (5 processes, about 20-40 s on the shared 2-core machine) of tiny-cnn — BatchNorm and a
skip tensor crossing some cuts — with 3 clients of different cuts and data shares on 2 helpers,
2 rounds of 2 batch updates each. Checked against it: every client's FedAvg'd model equals the
single-process reference (tests/psl/reference.py), and every helper ran its tasks in the plan's
order. Bad input is refused before any process starts (exit 2, one line).
"""

from __future__ import annotations

import json

import pytest
import torch

from hppctl.models.psl import PslPiece, PslRequest
from hppctl.planner.psl import plan_times
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.psl.config import PslOptions
from hppctl.runtime.psl.session import PslRunRequest, PslSession, summarize
from hppctl.runtime.psl.topology import PslTopology, collapsed_plan, task_order, task_tails
from hppctl.store import save
from tests.psl.factories import make_times
from tests.psl.reference import psl_reference
from tests.runtime.factories import local_cluster

CLIENTS, HELPERS = ["c0", "c1", "c2"], ["h0", "h1"]


def tiny_plan(model: str = "tiny-cnn", cuts=((2, 5), (4, 9), (3, 7))):
    """balanced-greedy puts c0, c2 on h0 and c1 on h1; c2's input arrives first (r) but its gradient
    last (long l + l′), so h0 serves F:c2 F:c0 B:c0 B:c2 — not the clients' index order."""
    times = make_times(r=[[2, 2, 1], [2, 2, 1]], p=2, l=[1, 1, 4], lp=[1, 1, 4], pp=2, rp=1)
    request = PslRequest(clients=CLIENTS, helpers=HELPERS, cuts=[list(c) for c in cuts], batch=8)
    return plan_times(times, request, "balanced-greedy", model=model, granularity="fine")


OPTIONS = PslOptions(train=TrainOptions(rounds=2, dataset="digits", lr=0.05, momentum=0.9, threads=1),
                     local_batches=2, shares=[3.0, 1.0, 2.0])


@pytest.fixture(scope="module")
def run():
    plan = tiny_plan()
    result = PslSession(PslRunRequest(plan, local_cluster(*CLIENTS, *HELPERS), OPTIONS)).run()
    return plan, result


@pytest.mark.gloo
def test_fedavg_model_equals_the_single_process_reference(run):
    plan, result = run
    # arrange: the whole-model reference, each client on its own shard, weighted average each round
    expected = psl_reference(plan.model, plan.batch, len(plan.clients), OPTIONS)
    for j, client in enumerate(plan.clients):
        # assert: parts 1 and 3 (client) and the helper's part-2 copy make the averaged model
        torch.testing.assert_close(result.client_model(client), expected[j], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(expected[0], expected[1])  # after FedAvg every client holds the same model


@pytest.mark.gloo
def test_helpers_run_the_plans_task_order(run):
    plan, result = run
    assert [str(p) for p in plan.helper_plans[0].sequence] == ["F:c2", "F:c0", "B:c0", "B:c2"]
    executed = [{h: [tuple(t[:2]) for t in b["helpers"][h]] for h in plan.helpers}
                for row in result.rounds for b in row["batches"]]
    assert len(executed) == OPTIONS.train.rounds * OPTIONS.local_batches
    for batch in executed:
        assert batch == {h.helper: [(p.kind, p.client) for p in h.sequence] for h in plan.helper_plans}
    summary = summarize(result)
    assert summary["helper_order_followed"] and summary["batches"] == 4
    assert set(summary["clients"]) == set(CLIENTS)


def _piece(text: str, fraction: float = 1.0) -> PslPiece:
    kind, client = text.split(":")
    return PslPiece(kind=kind, client=client, fraction=fraction, start_s=0.0, end_s=0.0)


@pytest.mark.parametrize("sequence, order", [
    (["F:a", "F:b", "B:a", "B:b"], [("F", "a"), ("F", "b"), ("B", "a"), ("B", "b")]),
    # preempted: a task runs whole where its last piece is (the order the plan completes tasks in)
    ([("F:a", 0.5), "F:b", ("F:a", 0.5), ("B:b", 0.25), "B:a", ("B:b", 0.75)],
     [("F", "b"), ("F", "a"), ("B", "a"), ("B", "b")]),
])
def test_task_order_collapses_preempted_pieces(sequence, order):
    pieces = [_piece(*p) if isinstance(p, tuple) else _piece(p) for p in sequence]
    assert task_order(pieces) == order


def test_collapsed_plan_replays_one_piece_per_task():
    plan = tiny_plan()
    collapsed = collapsed_plan(plan)
    assert PslTopology.of(collapsed).orders == PslTopology.of(plan).orders
    assert all(p.fraction == 1.0 for h in collapsed.helper_plans for p in h.sequence)


# --- bad input: exit 2, one line, before any worker starts ------------------------------------------

@pytest.fixture
def files(tmp_path):
    def write(plan=None, devices=(*CLIENTS, *HELPERS), cluster_text=None):
        plan_path, cluster_path = tmp_path / "plan.yaml", tmp_path / "cluster.yaml"
        save(plan_path, plan or tiny_plan())
        if cluster_text is None:
            save(cluster_path, local_cluster(*devices))
        else:
            cluster_path.write_text(cluster_text)
        return ["--plan", str(plan_path), "--cluster", str(cluster_path)]
    return write


@pytest.mark.parametrize("case, message", [
    ("missing-device", "clients.2: device 'c2' is not in"),
    ("preset-device", "device 'h1' is a preset"),
    ("cut-beyond-model", "cuts.1: client 'c1': cut [4, 9] must satisfy σ2 < 5"),
    ("shares-count", "--shares: 2 values for the plan's 3 clients"),
    ("shard-too-small", "client 'c1' gets"),
])
def test_bad_input_is_exit_2_with_one_line(cli, files, case, message):
    extra = []
    if case == "missing-device":
        args = files(devices=["c0", "c1", "h0", "h1"])
    elif case == "preset-device":
        args = files(cluster_text="name: x\ndevices:\n" + "".join(f"  - {{name: {d}, local: true}}\n" for d in
                                                                  (*CLIENTS, "h0")) + "  - {name: h1, preset: rpi4}\n")
    elif case == "cut-beyond-model":
        args = files(plan=tiny_plan("tiny-mlp", cuts=((1, 3), (4, 9), (2, 4))))
    elif case == "shares-count":
        args, extra = files(), ["--shares", "1,2"]
    else:
        args, extra = files(), ["--shares", "1,0.001,1", "--dataset", "digits"]
    code, stdout, stderr = cli("psl", "run", *args, *extra)
    assert code == 2
    assert stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], stderr


@pytest.mark.parametrize("extra, message", [
    ([], "clients.2: device 'c2' is not in"),           # the psl pre-flight, not the HPP plan loader
    (["--epochs", "2"], "--epochs: not supported for psl plans"),
])
def test_hppctl_run_hands_psl_plans_to_the_psl_runtime(cli, files, extra, message):
    args = files(devices=["c0", "c1", "h0", "h1"])
    code, _, stderr = cli("run", *args, *extra)
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and message in stderr, stderr


def test_fedavg_groups_tensors_by_the_ranks_holding_them():
    from hppctl.runtime.psl.fedavg import holder_groups

    # one cut for all: parts 1 and 3 on the clients (ranks 0-2), part 2 on both helpers (3, 4)
    topo = PslTopology.of(tiny_plan("tiny-mlp", cuts=((2, 4),) * 3))
    groups = {g.ranks: [name for name, _ in g.tensors] for g in holder_groups(topo, "tiny-mlp", "fine", 5)}
    assert groups == {(0, 1, 2): ["model.blocks.0.0.weight", "model.blocks.0.0.bias", "model.head.weight",
                                  "model.head.bias"],
                      (3, 4): ["model.blocks.1.0.weight", "model.blocks.1.0.bias"]}
    # per-client cuts: block 1 is in c1's part 1 (rank 1) and in c0's and c2's part 2 (both on h0, rank 3);
    # c1's part 2 on h1 (rank 4) is an activation alone, so h1 averages nothing
    topo = PslTopology.of(tiny_plan("tiny-mlp", cuts=((2, 4), (3, 4), (2, 4))))
    groups = {g.ranks: [name for name, _ in g.tensors] for g in holder_groups(topo, "tiny-mlp", "fine", 5)}
    assert groups[(1, 3)] == ["model.blocks.1.0.weight", "model.blocks.1.0.bias"]
    assert not any(4 in ranks for ranks in groups)


@pytest.mark.gloo
def test_psl_run_end_to_end_with_the_online_ltf_order(cli, files, tmp_path):
    # arrange: tiny-mlp, 3 clients on 2 helpers, one round of two batch updates, helpers pick online
    plan = tiny_plan("tiny-mlp", cuts=((1, 3), (2, 4), (1, 3)))
    args = files(plan=plan)
    metrics, model = tmp_path / "m.jsonl", tmp_path / "model.pt"
    # act
    code, stdout, _ = cli("psl", "run", *args, "--order", "ltf", "--local-batches", "2", "--dataset", "digits",
                          "--optimizer", "sgd", "--lr", "0.1", "--metrics", metrics, "--save-model", model, "--threads", "1", "--json")
    # assert: one JSON summary, one metrics line, the saved model is the FedAvg'd one (order changes no number)
    assert code == 0
    summary = json.loads(stdout)
    assert summary["order"] == "ltf" and summary["batches"] == 2 and 0 <= summary["test_accuracy"] <= 1
    row = json.loads(metrics.read_text())
    options = PslOptions(train=TrainOptions(rounds=1, dataset="digits", lr=0.1), local_batches=2)
    expected = psl_reference(plan.model, plan.batch, 3, options)[0]
    saved = torch.load(model, weights_only=True)
    torch.testing.assert_close(saved, {k.removeprefix("model."): v for k, v in expected.items()}, rtol=1e-4, atol=1e-5)
    # and every choice followed the rule: no task the helper had seen ready waited behind one with a smaller tail
    for batch in row["batches"]:
        for helper, tasks in batch["helpers"].items():
            tails = task_tails(plan, helper)
            assert sorted((k, c) for k, c, *_ in tasks) == sorted(tails)
            for n, (kind, client, start, _, _) in enumerate(tasks):
                for later in tasks[n + 1:]:
                    if later[4] <= start:
                        assert tails[(later[0], later[1])] <= tails[(kind, client)], tasks


@pytest.mark.parametrize("arrivals, tails, expected", [
    # both forwards ready at once: the larger tail first; while F:a runs (0.5-1), B:b (tail 1) arrives
    # at 0.75 and B:a (tail 3) at 1: B:a goes first although B:b arrived earlier
    ({"F:a": 0, "F:b": 0, "B:a": 1.0, "B:b": 0.75}, {"F:a": 5, "F:b": 9, "B:a": 3, "B:b": 1},
     ["F:b", "F:a", "B:a", "B:b"]),
    # nothing is ready until F:a arrives: the helper does not wait for the larger tail
    ({"F:a": 1, "F:b": 3, "B:a": 2, "B:b": 4}, {"F:a": 1, "F:b": 9, "B:a": 1, "B:b": 9},
     ["F:a", "B:a", "F:b", "B:b"]),
])
def test_ltf_serves_the_ready_task_with_the_largest_tail(arrivals, tails, expected):
    from hppctl.runtime.psl import roles

    # arrange: a fake clock; each task takes 0.5; inputs arrive at scripted times
    clock = {"now": 0.0}
    due = {tuple(k.split(":")): at for k, at in arrivals.items()}
    ran = []

    def take(block):
        if block and not any(at <= clock["now"] for at in due.values()):
            clock["now"] = min(due.values())  # wait for the next arrival
        out = [(task, at) for task, at in due.items() if at <= clock["now"]]
        for task, _ in out:
            del due[task]
        return out

    def run(task, ready):
        ran.append(f"{task[0]}:{task[1]}")
        clock["now"] += 0.5

    helper = roles.Helper.__new__(roles.Helper)
    helper.copies = {"a": None, "b": None}
    helper.tails = {tuple(k.split(":")): v for k, v in tails.items()}
    helper._run = run
    # act
    helper._serve_largest_tail_first(take)
    # assert
    assert ran == expected


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_psl_run_that_diverges_exits_4(cli, files):
    # issue 25, item 3: --lr 1e6 made `loss nan` and exit 0; the launcher's divergence check stops it
    args = files(plan=tiny_plan("tiny-mlp", cuts=((1, 3), (2, 4), (1, 3))))
    code, _, err = cli("psl", "run", *args, "--rounds", "4", "--local-batches", "2", "--optimizer", "sgd", "--lr", "1e6", "--threads", "1")
    assert code == 4, err
    assert err.strip().splitlines()[-1].startswith("error: training diverged: round ") and "Traceback" not in err
    code, _, err = cli("psl", "run", *args, "--rounds", "2", "--optimizer", "sgd", "--lr", "1e6", "--threads", "1", "--divergence-factor", "0")
    assert code == 0, err
