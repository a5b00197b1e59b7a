"""Fault tolerance plugs into the one training loop (issue 26 item 4): `FtSession` keeps no copy
of `Session`'s loop, no attribute of its own appears outside `__init__`, and its state across the
loop's passes lives in one dataclass (`FaultState`). Read from the source, so a copy that creeps
back in fails here rather than in review."""

from __future__ import annotations

import ast
from pathlib import Path

from hppctl.runtime import ft_detection, ft_session, session

PUBLIC_REASSIGNED = {"generation"}
"""Public attributes callers read (tests, the CLI's summary) that `__init__` sets and the run moves on."""
LOOP = {"_watch", "_consume_reports", "_write_checkpoints", "_due_rounds", "_final_states", "_check_alive"}
"""`Session`'s loop and its parts: fault tolerance uses them through hooks, never rewrites them."""


def _class(module, name: str) -> ast.ClassDef:
    tree = ast.parse(Path(module.__file__).read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _assigned(function: ast.FunctionDef) -> set[str]:
    """The `self.X` attributes a method assigns (plain, annotated or augmented, or in a tuple)."""
    found = set()
    for node in ast.walk(function):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            for part in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id == "self":
                    found.add(part.attr)  # `self.ft.x = …` changes `self.ft`'s field, not `self`
    return found


def _methods(cls: ast.ClassDef) -> list[ast.FunctionDef]:
    return [f for f in cls.body if isinstance(f, ast.FunctionDef)]


def test_resilient_session_assigns_no_attribute_outside_init_but_the_public_ones():
    outside = {attr: f.name for f in _methods(_class(ft_session, "FtSession")) if f.name != "__init__"
               for attr in _assigned(f)}
    assert set(outside) <= PUBLIC_REASSIGNED, outside


def test_every_attribute_resilient_session_moves_on_is_made_in_an_init():
    inits = set()
    for module, name in ((ft_session, "FtSession"), (session, "Session")):
        inits |= _assigned(next(f for f in _methods(_class(module, name)) if f.name == "__init__"))
    moved = {attr for f in _methods(_class(ft_session, "FtSession")) if f.name != "__init__" for attr in _assigned(f)}
    assert moved <= inits, moved - inits


def test_resilient_session_keeps_no_copy_of_the_loop():
    names = {f.name for f in _methods(_class(ft_session, "FtSession"))}
    assert not names & LOOP, names & LOOP
    assert len(names) <= 24, len(names)  # 38 before the loop was shared, 30 before detection left (FaultDetector)


def test_session_owns_the_loop_and_its_hooks():
    names = {f.name for f in _methods(_class(session, "Session"))}
    assert {"_watch", "_consume_reports", "_on_tick", "_round_report", "_finished", "_release", "_adopt"} <= names


def test_detection_is_one_object_resilient_session_owns():
    """Suspicion, probes, arming and the drop log are `FaultDetector`'s (runtime/ft_detection.py): the
    session holds one and keeps no detection method or state of its own."""
    names = {f.name for f in _methods(_class(ft_session, "FtSession"))}
    assert not names & {"probe_address", "_suspect", "_arm", "_log_dropped", "_detect", "_apply"}, names
    init = next(f for f in _methods(_class(ft_session, "FtSession")) if f.name == "__init__")
    assert "detector" in _assigned(init)
    fault_state = {n.target.id for n in _class(ft_session, "FaultState").body if isinstance(n, ast.AnnAssign)}
    assert not fault_state & {"probes", "probe_ports", "t0", "dropped_seen", "leaver_heard", "on_state"}, fault_state
    assert {"arm", "detect", "suspect", "log_dropped", "probe_address"} <= {
        f.name for f in _methods(_class(ft_detection, "FaultDetector"))}
