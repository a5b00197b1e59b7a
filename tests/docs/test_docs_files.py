"""Issue 25 item 1: the docs' first command blocks name input files that exist in the repository
(examples/, profiles/, plans/) and write under out/ (docs/lab.md cited env-d-lab.yaml, docs/psl.md
psl.yaml, others P.yaml, C.yaml, prof.json)."""

from __future__ import annotations

import re

import pytest

from tests.docs.commands import REPO, commands
from tests.docs.test_help_examples import files_named


def block_after(doc: str, heading: str) -> list[str]:
    text = (REPO / "docs" / doc).read_text()
    block = re.search(r"```(?:bash)?\n(.*?)```", text[text.index(heading):], re.S)
    return [line for line in block.group(1).splitlines() if line.startswith("hppctl ")]


@pytest.mark.parametrize("doc, heading", [
    ("lab.md", "## Quick start"), ("psl.md", "## Commands"), ("galaxy.md", "## Commands"),
    ("simulator.md", "# Simulator"), ("schedule.md", "# Schedules"), ("timeprest.md", "# TiMePReSt"),
    ("runtime.md", "# The training runtime"), ("fault-tolerance.md", "# Fault tolerance"),
    ("profiling.md", "## End to end"),
])
def test_quick_start_commands_name_files_that_exist(doc, heading):
    lines = block_after(doc, heading)
    assert lines
    for line in lines:
        for argv in commands(re.sub(r"\[[^]]*\]", "", line)):
            inputs, outputs = files_named(argv)
            assert all(o.startswith("out/") for o in outputs), (line, outputs)
            missing = [name for name in inputs if not name.startswith("out/") and not (REPO / name).exists()]
            assert not missing, f"docs/{doc}: {line}: {missing}"
