"""Tier 2: every inference strategy on 1-4 gloo processes equals the Hugging Face model's own forward.

Small configs of the three families the paper runs (BERT post-LN, GPT-2 and OPT pre-LN with causal
masks; DistilBERT too), heterogeneous head/column splits (including a device with no head), odd
sequence lengths not divisible by the number of devices, with and without the tile overlap, with
the overlap on some collectives only (a plan's block_overlap), and galaxy's split on gloo's
AllReduce (a plan's collective: all-reduce).
"""

from __future__ import annotations

import pytest
import torch

from hppctl.runtime.galaxy.weights import extract
from tests.galaxy.factories import hf_model
from tests.galaxy.spawned import run_cases

pytestmark = pytest.mark.gloo

FAMILIES = ("bert", "gpt2", "opt", "distilbert")
# per ring collective (attention in/out, MLP in/out), as a plan's block_overlap: a different mix per family
MIXED = ((True, False, False, True), (False, True, True, False), (True, True, False, False), (False, False, True, True))


def reference(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids[None]).last_hidden_state[0]


def split_cases(world: int, seq_len: int, heads: list[int], columns: list[int]):
    """(expected, case) pairs: every family x {galaxy with and without overlap, megatron, sp}."""
    from hppctl.planner.galaxy import largest_remainder, split_rows

    rows = split_rows(seq_len, world)
    equal_heads, equal_columns = largest_remainder(4, [1] * world), largest_remainder(128, [1] * world)
    pairs = []
    for n, family in enumerate(FAMILIES):
        model = hf_model(family, seed=n)
        ids = torch.randint(0, 100, (seq_len,), generator=torch.Generator().manual_seed(n))
        weights, expected = extract(model, family), reference(model, ids)
        for strategy, overlap, a, b in (("galaxy", True, heads, columns), ("galaxy", False, heads, columns),
                                        ("galaxy", MIXED[n], heads, columns),
                                        ("galaxy/all-reduce", False, heads, columns),
                                        ("megatron", False, equal_heads, equal_columns), ("sp", False, None, None)):
            pairs.append((f"{family}/{strategy}/{overlap}", expected,
                          (strategy, overlap, weights, a, b, rows, ids)))
    return pairs


@pytest.mark.parametrize("world, seq_len, heads, columns", [
    (1, 7, [4], [128]),
    (2, 11, [3, 1], [90, 38]),
    (3, 13, [2, 0, 2], [64, 40, 24]),    # a device without heads; 13 rows = 5 + 4 + 4
    (4, 10, [1, 1, 1, 1], [50, 30, 30, 18]),  # 10 rows = 3 + 3 + 2 + 2
])
def test_strategies_equal_the_single_process_model(world, seq_len, heads, columns):
    # arrange
    pairs = split_cases(world, seq_len, heads, columns)
    # act
    outputs = run_cases(world, [case for _, _, case in pairs])
    # assert
    for (label, expected, _), got in zip(pairs, outputs):
        assert got.shape == expected.shape, label
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4, msg=lambda m: f"{label}: {m}")


def test_half_precision_on_the_wire_stays_close_to_the_model():
    """float16 activations on the wire (the paper's traffic): every strategy within fp16 rounding of
    the model, and the tiles still land on the right rows (a misplaced tile is off by O(1))."""
    from hppctl.planner.galaxy import split_rows

    model = hf_model("gpt2", seed=7)
    ids = torch.randint(0, 100, (11,), generator=torch.Generator().manual_seed(7))
    weights, expected = extract(model, "gpt2"), reference(model, ids)
    rows = split_rows(11, 3)
    cases = [(s, o, weights, [2, 1, 1], [64, 40, 24], rows, ids, "float16")
             for s, o in (("galaxy", True), ("galaxy", False), ("megatron", False), ("sp", False))]
    cases[2] = ("megatron", False, weights, [2, 1, 1], [43, 43, 42], rows, ids, "float16")
    for case, got in zip(cases, run_cases(3, cases)):
        torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2, msg=lambda m: f"{case[0]}: {m}")
        assert not torch.equal(got, expected)  # the wire really carried fp16
