"""The import graph of hppctl: no cycle, no private name across packages, imports point down the layers.

Read from the source with `ast` (no import is executed), every `import`/`from … import` at any depth,
function-level ones included (a cycle closed inside a function is still a cycle: either module can
only be understood with the other), relative imports resolved, `from pkg import sub` counted as an
import of the submodule. Granularity: modules for cycles, packages (`hppctl.<first part>`) for layers.

The allowlists below name what other work in progress removes; delete an entry once it is gone
(the test fails on a stale entry, so the list cannot outlive its reason).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hppctl"

ALLOWED_CYCLES: set[frozenset[str]] = set()
"""Cycles another change is removing, each with the change that does (none left: issue 26 removed them)."""

LAYERS = [
    {"__main__", "cli", "check"},
    {"driver"},
    {"runtime"},
    {"schedule"},
    {"ft"},
    {"planner"},
    {"profiling", "zoo", "lab", "ssh"},
    {"models"},
    {"store", "errors", "limits", "allocator", "usercode", "shutdown", "hppctl"},
]
"""Top to bottom: a package imports its own tier (no cycle: see the package check) or lower ones.
`ft` (the pure fault-tolerance rules: replay, state, status) sits between `schedule` and `planner`:
`schedule/failure.py` simulates a failure with its replay rules, and it imports only the planner and
models. `ssh` (the fabric connection helper) is shared by the profiler, the lab, the launcher and
`check`. `hppctl` is the package's own `__init__` (the version)."""

ALLOWED_UPWARD = {
    # the `inference-blocks` probe times the inference runtime's own kernels (hmp.linear, attention,
    # connective) and weight shards: a copy in profiling would measure something the runtime does not run
    ("hppctl.profiling.inference_probe", "hppctl.runtime.galaxy.hmp"),
    ("hppctl.profiling.inference_probe", "hppctl.runtime.galaxy.weights"),
    # the probe resolves `accelerator:` and times on it with the runtime's own functions (resolve,
    # synchronized_clock, the CUDA allocator's peak), so a profile measures the device a run computes on
    ("hppctl.profiling.device", "hppctl.runtime.accelerator"),
    ("hppctl.profiling.train_probe", "hppctl.runtime.accelerator"),
}


def module_files() -> dict[str, Path]:
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


MODULES = module_files()


def enclosing_module(name: str) -> str:
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imported(module: str, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """(target module, imported name or None) for one import statement, hppctl targets only."""
    if isinstance(node, ast.Import):
        return [(enclosing_module(a.name), None) for a in node.names if a.name.split(".")[0] == "hppctl"]
    if node.level:
        base = module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]
        for _ in range(node.level - 1):
            base = base.rsplit(".", 1)[0]
        source = base + ("." + node.module if node.module else "")
    else:
        source = node.module or ""
    if source.split(".")[0] != "hppctl":
        return []
    out = []
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        out.append((sub, None) if sub in MODULES else (enclosing_module(source), alias.name))
    return out


def import_edges() -> list[tuple[str, str, str | None, int]]:
    """(importer, imported module, name or None, line) for every hppctl import in hppctl."""
    edges = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges += [(module, target, name, node.lineno) for target, name in imported(module, node)
                          if target != module]
    return edges


EDGES = import_edges()


def strongly_connected(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Tarjan's strongly connected components with more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "hppctl"


def home_package(module: str) -> str:
    """The package a module belongs to: itself for an `__init__`, else its parent."""
    return module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]


def tier(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def cycle_report(cycles: list[frozenset[str]]) -> str:
    lines = []
    for cycle in cycles:
        lines.append(" <-> ".join(sorted(cycle)))
        lines += [f"    {a} -> {b} (line {n})" for a, b, n in sorted({(a, b, n) for a, b, _, n in EDGES
                                                                   if a in cycle and b in cycle})]
    return "\n".join(lines)


def test_the_scan_sees_the_imports_it_must():
    # guards against a scan that silently finds nothing: a top-level import, function-level ones
    # and a `from package import submodule` import, all known to exist
    edges = {(a, b) for a, b, _, _ in EDGES}
    assert ("hppctl.runtime.launch", "hppctl.runtime.zygote") in edges
    assert ("hppctl.planner.galaxy", "hppctl.planner.strategies.galaxy") in edges  # inside a function
    assert ("hppctl.profiling.inference_probe", "hppctl.runtime.galaxy.hmp") in edges  # inside a function
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


def test_no_module_import_cycle_outside_the_allowlist():
    graph: dict[str, set[str]] = {}
    for a, b, _, _ in EDGES:
        graph.setdefault(a, set()).add(b)
    cycles = strongly_connected(graph)
    unexpected = [c for c in cycles if c not in ALLOWED_CYCLES]
    assert not unexpected, "import cycles:\n" + cycle_report(unexpected)
    stale = ALLOWED_CYCLES - set(cycles)
    assert not stale, f"allowlisted cycles that are gone, delete their entries: {sorted(map(sorted, stale))}"


def test_no_package_import_cycle():
    graph: dict[str, set[str]] = {}
    for a, b, _, _ in EDGES:
        if package_of(a) != package_of(b) and frozenset({a, b}) not in ALLOWED_CYCLES:
            graph.setdefault(package_of(a), set()).add(package_of(b))
    cycles = strongly_connected(graph)
    assert not cycles, "package cycles:\n" + "\n".join(
        f"{' <-> '.join(sorted(c))}: " + ", ".join(f"{pa} -> {pb}" for pa, pb in sorted(
            {(package_of(x), package_of(y)) for x, y, _, _ in EDGES
             if package_of(x) in c and package_of(y) in c and package_of(x) != package_of(y)}))
        for c in cycles)


def test_no_private_name_is_imported_from_another_package():
    crossing = [f"{MODULES[a].relative_to(ROOT)}:{n} imports {name} from {b}" for a, b, name, n in EDGES
                if name and name.startswith("_") and not name.startswith("__") and home_package(a) != home_package(b)]
    assert not crossing, "\n".join(crossing)


def test_every_package_has_a_layer():
    assert {package_of(m) for m in MODULES} - set().union(*LAYERS) == set()


def test_imports_point_down_the_layers():
    upward = sorted({(a, b, n) for a, b, _, n in EDGES
                     if tier(package_of(b)) < tier(package_of(a)) and (a, b) not in ALLOWED_UPWARD})
    assert not upward, "\n".join(f"{MODULES[a].relative_to(ROOT)}:{n} imports {b}, a higher layer" for a, b, n in upward)
    stale = ALLOWED_UPWARD - {(a, b) for a, b, _, _ in EDGES}
    assert not stale, f"allowlisted upward imports that are gone, delete their entries: {sorted(stale)}"
