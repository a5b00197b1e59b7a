"""Library code lives below the CLI (hppctl/driver.py): nothing outside hppctl/cli imports it except
to run it as a command, and `hppctl.cli.run` (the function tests and bench call) no longer hides
the `hppctl run` module (it is hppctl/cli/run_cmd.py)."""

from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI_AS_COMMAND = {("hppctl.cli", "run"), ("hppctl.cli", "main")}
"""`from hppctl.cli import run` (the CLI on an argv list) and `main` (`python -m hppctl`): the CLI
as a command, the one use allowed outside it."""


def cli_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every import of hppctl.cli in `path`, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hppctl.cli"):
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.startswith("hppctl.cli")]
    return found


def outside_cli() -> list[Path]:
    files = [ROOT / "hppctl" / "driver.py", ROOT / "hppctl" / "check.py", *sorted((ROOT / "bench").glob("*.py"))]
    files += [p for p in sorted((ROOT / "hppctl").rglob("*.py")) if "cli" not in p.relative_to(ROOT / "hppctl").parts]
    return sorted(set(files))


@pytest.mark.parametrize("path", outside_cli(), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_cli_imports_the_cli(path):
    assert [i for i in cli_imports(path) if i not in CLI_AS_COMMAND] == []


def test_run_and_coordinator_do_not_import_each_other():
    cli = ROOT / "hppctl" / "cli"
    assert not [m for m, _ in cli_imports(cli / "coordinator.py") if m.startswith("hppctl.cli.run")]
    assert all(name != "run_cmd" for _, name in cli_imports(cli / "coordinator.py"))


def test_the_run_command_module_is_a_module_and_run_is_the_function():
    import hppctl.cli.run_cmd as module
    from hppctl.cli import run

    assert isinstance(module, types.ModuleType) and callable(module.run_command)
    assert importlib.import_module("hppctl.cli.run_cmd") is module
    assert isinstance(run, types.FunctionType) and run(["--version"]) == 0
