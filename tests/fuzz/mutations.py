"""Hypothesis strategies that turn a valid document (a parsed JSON/YAML file) into hostile file bytes.

A mutation picks a node of the document and does one of: replace it by a hostile value (NaN,
±inf, 0, negative, 1e400, 1e-300, huge integers, non-ASCII or huge strings, null), swap its type,
delete it, add an unknown key beside it, or put a list where a map was (or the reverse). The
document is then written in its own format, and the bytes may be truncated or given invalid
UTF-8. Nesting thousands deep (`deeply_nested`) is a fixed case per format in test_structure.py:
as a Hypothesis mutation it was the first failure of every format and hid the others. Values the dumpers cannot write as wanted (a JSON `1e400` literal, deep
nesting without recursion) go in as placeholders replaced in the text.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import yaml
from hypothesis import strategies as st

HUGE_INT = 10**30
HOSTILE_NUMBERS = (math.nan, math.inf, -math.inf, 0, -1, -0.5, 1e-300, HUGE_INT, -HUGE_INT, 2**63, 1e308)
HOSTILE_NUMBER_TEXTS = ("1e400", "-1e400", "1e-300", "nan", "inf", "-inf", "0", "-1", str(HUGE_INT), "1e400GB",
                        "nanmbit", "infms", "1e400mbit", "-0")
HOSTILE_STRINGS = ("", " ", "é\u00e9\u4e2d\U0001F600", "\x00", "x" * 300, "../" * 40 + "etc/passwd",
                   "a/b", "null", "--help", "%s%n", "x" * 200_000)
OTHER_VALUES = (None, True, False, [], {}, [1, 2], {"k": 1}, [[]], [None])
DEEP_YAML, DEEP_JSON = 5000, 100_000
"""Nesting depths of the issue's RecursionError findings (items 7)."""

_RAW = "__fuzz_raw_{}__"
_DEEP = "__fuzz_deep__"


@dataclass
class Mutant:
    """The bytes to write and a one-line account of how they were made (shown on failure)."""

    data: bytes
    how: str


def node_paths(tree, prefix=()) -> list[tuple]:
    """Every path (tuple of keys/indices) to a node of `tree`, the root excluded."""
    found = []
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for key, child in items:
        found.append((*prefix, key))
        found.extend(node_paths(child, (*prefix, key)))
    return found


def _parent(tree, path):
    for key in path[:-1]:
        tree = tree[key]
    return tree


def _copy(tree):
    return json.loads(json.dumps(tree, allow_nan=True))


def hostile_values() -> st.SearchStrategy:
    return st.one_of(st.sampled_from(HOSTILE_NUMBERS), st.sampled_from(HOSTILE_NUMBER_TEXTS),
                     st.sampled_from(HOSTILE_STRINGS), st.sampled_from(OTHER_VALUES),
                     st.integers(min_value=-2**70, max_value=2**70),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))


def _swap_type(value):
    """The same information in another type: a number as a string, a map as a list, and so on."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, list):
        return {str(i): v for i, v in enumerate(value)}
    return 0


def _field(path: tuple) -> tuple:
    """The field a path names, list positions left out: `devices.*.memory` for devices.3.memory."""
    return tuple("*" if isinstance(key, int) else key for key in path)


@st.composite
def field_paths(draw, doc) -> tuple:
    """A node of `doc`, each field equally likely: a profile's thousand timings do not drown its
    one `memory_bytes`."""
    paths = node_paths(doc)
    fields = sorted({_field(p) for p in paths}, key=repr)
    field = draw(st.sampled_from(fields))
    return draw(st.sampled_from([p for p in paths if _field(p) == field]))


@st.composite
def mutated_document(draw, doc: dict) -> tuple[object, str]:
    """(a mutated copy of `doc`, how). Placeholders may stand for raw text (see `render`)."""
    doc = _copy(doc)
    op = draw(st.sampled_from(("replace", "replace", "replace", "swap", "delete", "extra", "raw-number", "root")))
    if op == "root":
        value = draw(st.sampled_from(([], "text", 0, None, [doc])))
        return value, f"the whole document replaced by {value!r:.60}"
    path = draw(field_paths(doc))
    parent, key = _parent(doc, path), path[-1]
    where = ".".join(map(str, path))
    if op == "replace":
        value = draw(hostile_values())
        parent[key] = value
        return doc, f"{where} = {value!r:.80}"
    if op == "swap":
        parent[key] = _swap_type(parent[key])
        return doc, f"{where} type-swapped to {parent[key]!r:.80}"
    if op == "delete":
        del parent[key]
        return doc, f"{where} deleted"
    if op == "extra":
        target = parent[key] if isinstance(parent[key], dict) else parent if isinstance(parent, dict) else doc
        target["fuzz_extra_key"] = draw(hostile_values())
        return doc, f"unknown key fuzz_extra_key added near {where}"
    token = draw(st.sampled_from(("1e400", "-1e400", "1e-300", "1" + "0" * 400)))
    parent[key] = _RAW.format(token)
    return doc, f"{where} = the literal {token[:20]}"


def deeply_nested(doc: dict, fmt: str) -> str:
    """`doc` with its first value nested DEEP_JSON (JSON) or DEEP_YAML (YAML) lists deep."""
    doc = _copy(doc)
    doc[next(iter(doc))] = _DEEP
    return render(doc, fmt)


def render(doc, fmt: str) -> str:
    """`doc` as JSON or YAML text, placeholders replaced by their raw text."""
    if fmt == "json":
        text = json.dumps(doc, ensure_ascii=False, indent=1)
        deep = "[" * DEEP_JSON + "]" * DEEP_JSON
    else:
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, default_flow_style=None, width=100)
        deep = "[" * DEEP_YAML + "]" * DEEP_YAML
    for quote in ('"', "'", ""):
        text = text.replace(f"{quote}{_DEEP}{quote}", deep)
    while "__fuzz_raw_" in text:
        start = text.index("__fuzz_raw_")
        end = text.index("__", start + len("__fuzz_raw_"))
        token = text[start + len("__fuzz_raw_"):end]
        left = start - 1 if start and text[start - 1] in "\"'" else start
        right = end + 3 if end + 2 < len(text) and text[end + 2] in "\"'" else end + 2
        text = text[:left] + token + text[right:]
    return text


@st.composite
def mutated_bytes(draw, data: bytes) -> tuple[bytes, str]:
    """`data` unchanged (mostly), truncated, or with invalid UTF-8 / a NUL inserted."""
    op = draw(st.sampled_from(("none", "none", "none", "truncate", "invalid-utf8", "nul", "empty")))
    if op == "none" or not data:
        return data, ""
    if op == "empty":
        return b"", "; file emptied"
    at = draw(st.integers(min_value=0, max_value=len(data) - 1))
    if op == "truncate":
        return data[:at], f"; truncated to {at} bytes"
    insert = b"\xff\xfe\xc3" if op == "invalid-utf8" else b"\x00"
    return data[:at] + insert + data[at:], f"; {op} bytes at {at}"


@st.composite
def mutants(draw, doc: dict, fmt: str) -> Mutant:
    """A hostile file made from `doc` (a valid document of format `fmt`, json or yaml)."""
    tree, how = draw(mutated_document(doc))
    data, more = draw(mutated_bytes(render(tree, fmt).encode("utf-8", errors="surrogatepass")))
    return Mutant(data, how + more)
