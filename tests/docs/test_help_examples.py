"""Issue 25 items 1 and 2: every `--help` of every command and subcommand cites example commands whose
input files exist (outputs go under out/), the cheap ones (models, plan, simulate) run as written from a
copy of the repository root (psl plan and simulate too), and no example is wrapped inside a command or run into another at 80 or
120 columns."""

from __future__ import annotations

import importlib.util
import re
import shutil

import pytest
import typer

from hppctl.cli import app
from tests.docs.commands import REPO, commands

OUTPUT_FLAGS = {"--out", "--output", "--trace", "--png", "--write-schedule", "--metrics", "--events",
                "--save-model", "--checkpoint-dir", "--workdir", ">"}
CHEAP = {("models",), ("plan",), ("simulate",), ("psl", "plan"), ("psl", "simulate")}


def command_paths(group=None, prefix=()) -> list[tuple[str, ...]]:
    group = group or typer.main.get_command(app)
    paths = []
    for name, command in sorted(group.commands.items()):
        paths.append(prefix + (name,))
        if hasattr(command, "commands"):
            paths += command_paths(command, prefix + (name,))
    return paths


PATHS = command_paths()


def help_text(cli, monkeypatch, path, width: int) -> str:
    monkeypatch.setenv("COLUMNS", str(width))
    code, out, err = cli(*path, "--help")
    assert code == 0, err
    return out


def example_paragraphs(text: str) -> list[list[str]]:
    """The blank-line separated paragraphs after the help's "Examples" heading, up to its options."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith("Examples")), None)
    if start is None:
        return []
    paragraphs: list[list[str]] = [[]]
    for line in lines[start:]:
        if re.match(r"(Options|Arguments|Commands):", line):
            break
        if line.strip():
            paragraphs[-1].append(line.strip())
        elif paragraphs[-1]:
            paragraphs.append([])
    return [p for p in paragraphs[1:] if p]


def example_commands(text: str) -> list[list[str]]:
    return [argv for paragraph in example_paragraphs(text) for line in paragraph if line.startswith("hppctl ")
            for argv in commands(line)]


def files_named(argv: list[str]) -> tuple[list[str], list[str]]:
    """(inputs, outputs): the arguments that name files, split by the flag before them."""
    inputs, outputs = [], []
    for flag, value in zip(["hppctl"] + argv, argv):
        if ":" in value or value.startswith("-") or not ("/" in value or re.search(r"\.(ya?ml|json|jsonl|pt|png)$", value)):
            continue
        (outputs if flag in OUTPUT_FLAGS else inputs).append(value)
    return inputs, outputs


def test_every_command_with_examples_is_found(cli, monkeypatch):
    cited = {path for path in PATHS if example_commands(help_text(cli, monkeypatch, path, 200))}
    assert {("plan",), ("simulate",), ("run",), ("profile",), ("models",), ("lab",), ("lab", "up"),
            ("psl",), ("psl", "run"), ("demo",), ("coordinator",)} <= cited


@pytest.mark.parametrize("path", PATHS, ids=" ".join)
def test_help_examples_name_files_that_exist(cli, monkeypatch, path):
    for argv in example_commands(help_text(cli, monkeypatch, path, 200)):
        inputs, outputs = files_named(argv)
        assert all(o.startswith("out/") for o in outputs), (argv, outputs)
        for name in inputs:
            assert name.startswith("out/") or (REPO / name).exists(), f"{' '.join(argv)}: {name} does not exist"


def test_cheap_help_examples_run_as_written(cli, monkeypatch, tmp_path):
    for name in ("examples", "profiles", "plans"):
        shutil.copytree(REPO / name, tmp_path / name)
    ran, seen = 0, set()
    for path in PATHS:
        for argv in example_commands(help_text(cli, monkeypatch, path, 200)):
            if tuple(argv) in seen:  # a group and its subcommands share their examples
                continue
            seen.add(tuple(argv))
            monkeypatch.chdir(tmp_path)
            inputs, _ = files_named(argv)
            if (not ({tuple(argv[1:2]), tuple(argv[1:3])} & CHEAP) or any(a.startswith("hf:") for a in argv) or ">" in argv
                    or not all((tmp_path / name).exists() for name in inputs)
                    or ("--png" in argv and importlib.util.find_spec("matplotlib") is None)):
                continue
            code, _, err = cli(*argv[1:])
            assert code == 0, f"{' '.join(argv)}: {err}"
            ran += 1
            monkeypatch.chdir(REPO)
    assert ran >= 15


@pytest.mark.parametrize("width", [80, 120])
def test_no_help_example_is_wrapped_or_run_together(cli, monkeypatch, width):
    for path in PATHS:
        for paragraph in example_paragraphs(help_text(cli, monkeypatch, path, width)):
            starts = [line.startswith(("hppctl ", "ssh ")) for line in paragraph]
            where = f"hppctl {' '.join(path)} --help at {width} columns: {paragraph}"
            assert all(starts) or not any(starts), f"an example wraps: {where}"
            for line in paragraph:
                command = line.split(" #")[0]
                assert not re.search(r"(?<!`)\bhppctl ", command[1:]), f"two examples on one line: {where}"
