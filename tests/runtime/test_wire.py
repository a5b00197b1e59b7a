"""The wire module names every store key of a run: its functions give the keys the runtime has
always used (a running launcher and a worker of another build must agree), and take_round reads a
round's reports once."""

import pytest
from torch.distributed import HashStore

from hppctl.runtime import bootstrap, wire


@pytest.mark.parametrize("key, expected", [
    (wire.nonce(), "nonce"), (wire.join("a"), "join/a"), (wire.start(), "start"), (wire.pid("a"), "pid/a"),
    (wire.done("a"), "done/a"), (wire.failed("a"), "failed/a"), (wire.progress("a"), "progress/a"),
    (wire.init(2), "init/2"), (wire.init_part(3, 7), "init/3-7"), (wire.resume(1), "resume/1"),
    (wire.metrics(12, "a"), "metrics/12/a"), (wire.ckpt(12, 1), "ckpt/12/1"), (wire.final(1), "final/1"),
    (wire.final("a"), "final/a"), (wire.ready("a"), "ready/a"), (wire.finished(2, "a"), "finished/2/a"),
    (wire.end(), "end"), (wire.stall(2, "a"), "stall/2/a"), (wire.gather(2), "gather/2"),
    (wire.reconf(2), "reconf/2"), (wire.heavy_old(2, 1), "heavy/2/old/1"), (wire.heavy_new(2, 1), "heavy/2/new/1"),
    (wire.arrived(2, "a"), "gen2/arrived/a"), (wire.moved(2, "a"), "gen2/moved/a"),
    (wire.generation_prefix(2), "gen2/"), (wire.shard("a"), "shard/a"), (wire.ids(), "ids"),
    (wire.output(), "output"), (wire.timings("a"), "timings/a"), (wire.PG_PREFIX, "pg/"),
    (wire.blob_chunk("init/0", 3), "init/0/3"), (wire.blob_count("init/0"), "init/0/n"),
])
def test_keys_are_the_ones_the_runtime_uses(key, expected):
    assert key == expected


def test_take_round_waits_for_every_device_then_reads_and_deletes_once():
    store = HashStore()
    store.set(wire.metrics(3, "a"), '{"loss": 1.5}')
    assert bootstrap.take_round(store, 3, ["a", "b"]) is None
    store.set(wire.metrics(3, "b"), '{"loss": 2.5}')
    assert bootstrap.take_round(store, 3, ["a", "b"]) == {"a": {"loss": 1.5}, "b": {"loss": 2.5}}
    assert not store.check([wire.metrics(3, "a")]) and not store.check([wire.metrics(3, "b")])
    assert bootstrap.take_round(store, 3, ["a", "b"]) is None


def test_wire_imports_nothing_of_hppctl():
    import ast
    from pathlib import Path
    tree = ast.parse(Path(wire.__file__).read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + \
               [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m and m.startswith("hppctl")], imported


def test_no_store_key_is_written_outside_the_wire_module():
    """Issue 26: every key is built by runtime/wire.py; a key literal elsewhere is a second vocabulary."""
    import re
    from pathlib import Path
    root = Path(wire.__file__).resolve().parents[1]
    families = ("nonce|join|start|pid|done|failed|progress|init|resume|metrics|ckpt|final|ready|finished|end|"
                "stall|gather|reconf|heavy|gen|arrived|moved|shard|ids|timings|output")
    key_literal = re.compile(rf'f"({families}|\{{key\}})[/{{]|store\.(set|get|check|wait|delete_key|add)\(\[?"({families})[/"]')
    found = [f"{p.relative_to(root)}:{n}: {line.strip()}" for p in sorted(root.rglob("*.py")) if p.name != "wire.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if key_literal.search(line)]
    assert not found, "\n".join(found)
