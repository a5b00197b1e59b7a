"""Whole-file pathologies, one fixed case per format: nesting thousands deep, empty, cut in half,
invalid UTF-8, a list at the top, a 200 kB value. Deterministic, so each is a regression case."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.fuzz.harness import assert_contract, invoke
from tests.fuzz.mutations import deeply_nested, render
from tests.fuzz.targets import FORMATS, fmt_of, read_seed


def _first_string_made_huge(doc: dict, fmt: str) -> bytes:
    doc = json.loads(json.dumps(doc))
    key = next(k for k, v in doc.items() if isinstance(v, str))
    doc[key] = "x" * 200_000
    return render(doc, fmt).encode()


PATHOLOGIES = {
    "nested-thousands-deep": lambda doc, fmt, raw: deeply_nested(doc, fmt).encode(),
    "empty": lambda doc, fmt, raw: b"",
    "cut-in-half": lambda doc, fmt, raw: raw[: len(raw) // 2],
    "invalid-utf8": lambda doc, fmt, raw: b"\xff\xfe" + raw,
    "list-at-top": lambda doc, fmt, raw: (json.dumps([doc]) if fmt == "json" else yaml.safe_dump([doc])).encode(),
    "huge-string-value": lambda doc, fmt, raw: _first_string_made_huge(doc, fmt),
}
CASES = [(f, name) for f in FORMATS for name in PATHOLOGIES]


@pytest.mark.parametrize("fmt, pathology", CASES, ids=[f"{f.name}-{p}" for f, p in CASES])
def test_a_broken_file_is_refused_in_one_line(fmt, pathology, tmp_path):
    seed = fmt.seeds[0]
    data = PATHOLOGIES[pathology](read_seed(seed), fmt_of(seed), seed.read_bytes())
    broken = tmp_path / f"broken{seed.suffix}"
    broken.write_bytes(data)
    argv, outputs = fmt.commands[0](broken, tmp_path)
    assert_contract(invoke(argv), outputs, allowed={2})
