"""Issue 25 item 1: every command of the README's "Everyday use" block runs as written, in order,
from a copy of the repository root (its inputs: examples/, profiles/), and writes only under out/."""

from __future__ import annotations

import shutil

import pytest

from tests.docs.commands import REPO, commands, hppctl, readme_block

LAB = "the lab lines need root and build network namespaces: the lab tier (tests/lab) covers `hppctl lab`"


@pytest.mark.slow
@pytest.mark.gloo
def test_everyday_use_runs_as_written_in_order(tmp_path):
    root = tmp_path / "repo"
    for name in ("examples", "profiles"):
        shutil.copytree(REPO / name, root / name)
    ran = 0
    for line in readme_block():
        for argv in commands(line):
            if argv[:2] == ["hppctl", "lab"]:
                continue
            done = hppctl(argv, root, timeout=300)
            assert done.returncode == 0, f"{line}\n{done.stderr[-2000:]}"
            ran += 1
    assert ran >= 15
    written = {p.relative_to(root).parts[0] for p in root.rglob("*") if p.is_file()}
    assert written <= {"examples", "profiles", "out"}, written
    assert sorted(p.name for p in (root / "examples").rglob("*")) == sorted(p.name for p in (REPO / "examples").rglob("*"))


def test_everyday_use_lab_lines_name_files_that_exist():
    lab = [argv for line in readme_block() for argv in commands(line) if argv[:2] == ["hppctl", "lab"]]
    assert [argv[2] for argv in lab] == ["up", "fault", "status", "down"]
    spec = lab[0][lab[0].index("--spec") + 1]
    assert hppctl(["hppctl", "lab", "up", "--help"], REPO, timeout=60).returncode == 0
    from hppctl.models.lab import LabSpec
    from hppctl.store import load
    assert load(REPO / spec, LabSpec).name == "env-d"
    pytest.skip(f"{LAB}: {'; '.join(' '.join(argv) for argv in lab)}")
