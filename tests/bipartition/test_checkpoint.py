"""Bi-Partition checkpoints: a worker's stage file holds the parameters it steps and the buffers of
the layers it forwards (runtime/bipartition.py), so a round's files join into the whole model; a
resumed worker needs every tensor of the layers it holds (both ranges) and the optimizer state of
those it steps. `checkpoint.recut` gives it exactly that, from a Bi-Partition round or a layer-wise
one, and a Bi-Partition round re-cuts to a layer-wise plan too. The resumed run itself (same
parameters as the undisturbed one): tests/runtime/test_schedule_matrix.py."""

from __future__ import annotations

import io

import pytest
import torch

from hppctl.errors import BadInput
from hppctl.runtime.bipartition import BiStage
from hppctl.runtime.checkpoint import recut, why_not_recut
from hppctl.runtime.lineage import plan_document
from hppctl.runtime.preflight import check_stage_files
from hppctl.runtime.stage import Stage
from tests.bipartition.factories import bi_plan
from tests.runtime.factories import make_plan

MODEL, LAYERS = "tiny-cnn", 11
"""Conv stem, a residual block and a head, with BatchNorm buffers: cuts fall inside the block."""


def plan_doc(forward, backward):
    return plan_document(bi_plan(MODEL, forward, backward, ["a", "b", "c"][:len(forward) - 1], global_batch=8,
                                 micro_batch=4))


def layer_wise_doc(cuts):
    stages = [((lo, hi), [f"d{i}"], [4]) for i, (lo, hi) in enumerate(zip(cuts, cuts[1:]))]
    return plan_document(make_plan(MODEL, stages, global_batch=8, micro_batch=4))


def trained_stage(stage, seed: int):
    """`stage` with its parameters and buffers moved off their initial values and an Adam state."""
    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(stage.parameters(), lr=0.01)
    for p in stage.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    with torch.no_grad():
        for b in stage.module.buffers():
            if b.is_floating_point():
                b.add_(torch.rand_like(b))
    return optimizer


def files_of(doc: dict, seed: int = 0) -> tuple[dict[int, bytes], dict, dict]:
    """The stage files a round of plan document `doc` writes (as `Worker.state_blob` does), and the
    whole model and per-parameter optimizer state they hold between them."""
    blobs, whole, optim = {}, {}, {}
    for p, s in enumerate(doc["stages"]):
        if s.get("backward_layers"):
            stage = BiStage(MODEL, "fine", s["layers"], s["backward_layers"], num_layers=LAYERS, seed=seed)
        else:
            stage = Stage(MODEL, "fine", *s["layers"], seed=seed)
        optimizer = trained_stage(stage, seed + p)
        state = stage.state_dict()
        whole.update(state)
        names = [n for n, q in stage.module.named_parameters() if any(q is r for r in stage.parameters())]
        optim.update({n: optimizer.state[q] for n, q in zip(names, stage.parameters())})
        buf = io.BytesIO()
        torch.save({"round": 3, "stage": p, "layers": [stage.start, stage.end], "model": state,
                    "optimizer": optimizer.state_dict()}, buf)
        blobs[p] = buf.getvalue()
    return blobs, whole, optim


def resumed(doc: dict, blobs: dict[int, bytes]):
    """Each stage of `doc` built fresh and loaded as a resumed worker loads its file (strictly)."""
    out = []
    for p, s in enumerate(doc["stages"]):
        state = torch.load(io.BytesIO(blobs[p]), weights_only=True)
        if s.get("backward_layers"):
            stage = BiStage(MODEL, "fine", s["layers"], s["backward_layers"], num_layers=LAYERS, seed=99)
        else:
            stage = Stage(MODEL, "fine", *s["layers"], seed=99)
        stage.module.load_state_dict(state["model"])  # strict: every tensor of the layers it holds
        optimizer = torch.optim.Adam(stage.parameters(), lr=0.01)
        optimizer.load_state_dict(state["optimizer"])
        out.append((stage, optimizer))
    return out


def assert_holds(stages, whole: dict, optim: dict) -> None:
    for stage, optimizer in stages:
        for name, tensor in stage.module.state_dict().items():
            torch.testing.assert_close(tensor, whole[name], rtol=0, atol=0, msg=name)
        stepped = {id(q) for q in stage.parameters()}
        for name, q in stage.module.named_parameters():
            if id(q) in stepped:
                for key, value in optim[name].items():
                    torch.testing.assert_close(optimizer.state[q][key], value, rtol=0, atol=0, msg=f"{name} {key}")


BI = ([0, 4, 7, LAYERS], [0, 3, 8, LAYERS])
"""Three workers whose forward and backward cuts differ at both inner cuts."""


def test_a_bipartition_round_resumes_every_worker_with_all_the_layers_it_holds():
    doc = plan_doc(*BI)
    blobs, whole, optim = files_of(doc)
    assert why_not_recut(doc, doc) is None
    assert_holds(resumed(doc, recut(blobs, doc, doc)), whole, optim)


@pytest.mark.parametrize("old, new", [
    (plan_doc(*BI), layer_wise_doc([0, 4, LAYERS])),
    (layer_wise_doc([0, 1, 6, LAYERS]), plan_doc(*BI)),
    (plan_doc(*BI), plan_doc([0, 3, 6, LAYERS], [0, 4, 7, LAYERS])),
], ids=["bipartition-to-layer-wise", "layer-wise-to-bipartition", "bipartition-to-another"])
def test_a_round_re_cuts_between_bipartition_and_layer_wise_plans(old, new):
    blobs, whole, optim = files_of(old)
    assert why_not_recut(old, new) is None
    assert_holds(resumed(new, recut(blobs, old, new)), whole, optim)


def test_the_stage_files_of_a_bipartition_round_are_checked_for_names_and_shapes(tmp_path):
    doc = plan_doc(*BI)
    blobs, _, _ = files_of(doc)
    meta = {"round": 3, "plan": doc}
    check_stage_files(tmp_path, meta, blobs)  # as written: accepted
    state = torch.load(io.BytesIO(blobs[1]), weights_only=True)
    name = next(iter(state["model"]))
    state["model"][name] = torch.zeros(3, 3, 3)
    buf = io.BytesIO()
    torch.save(state, buf)
    with pytest.raises(BadInput, match=f"stage-1.pt.*{name}"):
        check_stage_files(tmp_path, meta, {**blobs, 1: buf.getvalue()})
