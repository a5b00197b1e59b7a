"""`--workdir DIR` without workers: the content hash, what it leaves out, its bounds, the one line a
malformed DIR gets (exit 2), the archive a device unpacks, and the worker's import check."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile

import pytest

from hppctl import usercode
from hppctl.errors import BadInput
from hppctl.limits import MAX_WORKDIR_BYTES, MAX_WORKDIR_FILES
from hppctl.runtime.workdir import UserCode, UserModule, prepare, snapshot, user_code


@pytest.fixture(autouse=True)
def _no_import_root_left_behind():
    """Opening a workdir makes it this process's import root: leave none to the next test."""
    path = list(sys.path)
    yield
    usercode.set_root(None)
    sys.path[:] = path


def write_tree(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


TREE = {"pkg/__init__.py": "", "pkg/data.py": "X = 1\n", "train.py": "print('hi')\n"}


def test_the_hash_is_the_same_whatever_the_order_and_times_of_the_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_tree(a, TREE)
    write_tree(b, dict(reversed(TREE.items())))  # created in the other order
    for i, path in enumerate(sorted(b.rglob("*"))):
        os.utime(path, (1_000_000 + i, 2_000_000 + i))
    assert snapshot(a).digest == snapshot(b).digest
    assert snapshot(a).archive == snapshot(b).archive  # the bytes a device is sent, too


@pytest.mark.parametrize("change", ["content", "rename", "new file"])
def test_the_hash_changes_with_any_path_or_byte(tmp_path, change):
    write_tree(tmp_path, TREE)
    before = snapshot(tmp_path).digest
    if change == "content":
        (tmp_path / "pkg/data.py").write_text("X = 2\n")
    elif change == "rename":
        (tmp_path / "train.py").rename(tmp_path / "train2.py")
    else:
        (tmp_path / "pkg/extra.py").write_text("")
    assert snapshot(tmp_path).digest != before


def test_caches_and_the_repository_are_left_out(tmp_path):
    write_tree(tmp_path, TREE)
    before = snapshot(tmp_path).digest
    write_tree(tmp_path, {"pkg/__pycache__/data.cpython-311.pyc": "junk", ".git/HEAD": "ref: x\n",
                          ".git/objects/ab/cd": "blob"})
    after = snapshot(tmp_path)
    assert after.digest == before
    assert sorted(e.path for e in after.entries) == sorted(TREE)


def test_the_archive_unpacks_to_the_files_and_their_inner_links(tmp_path):
    src = tmp_path / "src"
    write_tree(src, TREE)
    (src / "link.py").symlink_to("pkg/data.py")
    (src / "pkglink").symlink_to("pkg")
    workdir = snapshot(src)
    out = tmp_path / "out"
    with tarfile.open(fileobj=io.BytesIO(workdir.archive)) as tar:
        tar.extractall(out, filter="data")
    assert (out / "pkg/data.py").read_text() == "X = 1\n"
    assert (out / "link.py").is_symlink() and (out / "link.py").read_text() == "X = 1\n"
    assert (out / "pkglink").is_symlink() and (out / "pkglink/data.py").read_text() == "X = 1\n"
    assert workdir.size == sum(len(t) for t in TREE.values())


def test_a_link_target_counts_in_the_hash(tmp_path):
    write_tree(tmp_path, {**TREE, "b.py": ""})
    (tmp_path / "link.py").symlink_to("train.py")
    before = snapshot(tmp_path).digest
    (tmp_path / "link.py").unlink()
    (tmp_path / "link.py").symlink_to("b.py")
    assert snapshot(tmp_path).digest != before


# --- malformed DIRs: one line naming --workdir -----------------------------------------------------

def malformed(tmp_path, kind: str):
    root = tmp_path / "wd"
    root.mkdir()
    write_tree(root, TREE)
    if kind == "missing":
        return tmp_path / "nope", "no such directory"
    if kind == "a file":
        return root / "train.py", "not a directory"
    if kind == "link out":
        (root / "secrets").symlink_to("/etc/passwd")
        return root, "symbolic link to /etc/passwd leaves"
    if kind == "link out by ..":
        (tmp_path / "outside.py").write_text("")
        (root / "pkg/up.py").symlink_to("../../outside.py")
        return root, "leaves"
    if kind == "fifo":
        os.mkfifo(root / "pipe")
        return root, "not a regular file, directory or link"
    if kind == "too big":  # sparse: refused from its size, never read
        with open(root / "data.bin", "wb") as f:
            f.truncate(MAX_WORKDIR_BYTES + 1)
        return root, "holds more than 64 MiB of files (limits.MAX_WORKDIR_BYTES), at data.bin"
    if kind == "too many files":
        many = root / "many"
        many.mkdir()
        for i in range(MAX_WORKDIR_FILES):
            (many / str(i)).touch()
        return root, f"holds more than {MAX_WORKDIR_FILES:,} files (limits.MAX_WORKDIR_FILES)"
    raise AssertionError(kind)


KINDS = ["missing", "a file", "link out", "link out by ..", "fifo", "too big", "too many files"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_malformed_workdir_is_refused_in_one_line(tmp_path, kind):
    path, expected = malformed(tmp_path, kind)
    with pytest.raises(BadInput) as e:
        snapshot(path)
    assert str(e.value).startswith("--workdir: ") and expected in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("command", [["run"], ["coordinator"], ["psl", "run"]])
@pytest.mark.parametrize("kind", ["missing", "link out", "too big"])
def test_every_command_refuses_a_malformed_workdir_with_exit_2(cli, tmp_path, command, kind):
    from hppctl.store import save
    from tests.conftest import make_profile
    from tests.runtime.factories import local_cluster, make_plan

    path, expected = malformed(tmp_path, kind)
    save(tmp_path / "plan.yaml", make_plan("tiny-mlp", [((0, 5), ["a"], [4])], global_batch=4, micro_batch=4))
    save(tmp_path / "cluster.yaml", local_cluster("a"))
    save(tmp_path / "profile.json", make_profile(layers=5, speeds=(1.0,)))
    extra = ["--profile", tmp_path / "profile.json"] if command == ["coordinator"] else []
    code, out, err = cli(*command, "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "cluster.yaml",
                         *extra, "--workdir", path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --workdir: ") and expected in lines[0], err
    assert out == ""


# --- the import root and the workers' check ------------------------------------------------------------

def test_the_workdir_comes_first_on_the_import_path(tmp_path, monkeypatch):
    """A module of the workdir wins over one of the same name in the current directory."""
    (tmp_path / "wd").mkdir()
    (tmp_path / "cwd").mkdir()
    (tmp_path / "wd" / "wdfirst_mod.py").write_text("WHERE = 'workdir'\n")
    (tmp_path / "cwd" / "wdfirst_mod.py").write_text("WHERE = 'cwd'\n")
    monkeypatch.chdir(tmp_path / "cwd")
    usercode.set_root(str(tmp_path / "wd"))
    try:
        assert usercode.import_module("wdfirst_mod").WHERE == "workdir"
    finally:
        sys.modules.pop("wdfirst_mod", None)


def test_a_module_edited_in_the_second_after_hppctl_imported_it_runs_as_edited(tmp_path, monkeypatch):
    """Python's bytecode cache keys on the source's mtime in whole seconds and its size: a module
    hppctl imported, then edited within that second to the same size (`channels=6` -> `channels=5`),
    ran from the old bytecode in the next command, while hppctl's fingerprint of the source said it
    had changed (tests/zoo/test_user_model.py's edit test failed so once bytecode was written).
    hppctl writes no bytecode for a user's modules."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # as for most users (not this machine's shell)
    module = tmp_path / "edited_in_the_second.py"
    module.write_text("CHANNELS = 6\n")
    usercode.set_root(str(tmp_path))
    try:
        assert usercode.import_module("edited_in_the_second").CHANNELS == 6
    finally:
        sys.modules.pop("edited_in_the_second", None)
    imported = module.stat()
    module.write_text("CHANNELS = 5\n")
    os.utime(module, ns=(imported.st_atime_ns, imported.st_mtime_ns))  # within the same second
    code = ("import sys; from hppctl import usercode; usercode.set_root(sys.argv[1]); "
            "print(usercode.import_module('edited_in_the_second').CHANNELS)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.stdout.strip() == "5", done.stdout + done.stderr


def test_user_modules_are_named_by_module_specs_only():
    code = user_code(None, dataset="mypkg.data:make", model="tiny-mlp")
    assert code.modules == (UserModule(flag="--dataset", spec="mypkg.data:make", module="mypkg.data"),)
    assert user_code(None, dataset="digits") is None
    assert user_code(None, dataset="synthetic", model="hf:bert") is None  # a checkpoint directory, not a module
    both = user_code(None, dataset="shared.m:data", model="shared.m:net")
    assert [m.module for m in both.modules] == ["shared.m"]  # imported once


def test_a_worker_reports_a_module_that_does_not_import_in_one_line(tmp_path):
    (tmp_path / "wdcheck_bad.py").write_text("import not_installed_here_xyz\n")
    (tmp_path / "wdcheck_good.py").write_text("X = 1\n")
    good = UserCode(path=str(tmp_path), modules=(UserModule(flag="--dataset", spec="wdcheck_good:f",
                                                            module="wdcheck_good"),))
    bad = UserCode(path=str(tmp_path), modules=(UserModule(flag="--dataset", spec="wdcheck_bad:f",
                                                           module="wdcheck_bad"),))
    try:
        assert prepare(good, "nano0") is None
        line = prepare(bad, "nano0")
    finally:
        for name in ("wdcheck_good", "wdcheck_bad"):
            sys.modules.pop(name, None)
    assert line == ("device 'nano0': --dataset wdcheck_bad:f: cannot import 'wdcheck_bad' on that device "
                    "(ModuleNotFoundError: No module named 'not_installed_here_xyz')")
    assert prepare(UserCode(path=str(tmp_path / "gone")), "nano1") == \
        f"device 'nano1': --workdir {tmp_path / 'gone'} is missing on this device"


def test_a_command_without_workdir_leaves_no_earlier_root_on_the_path(tmp_path):
    """`hppctl.cli.run` called twice in one process (bench/): the second run has no --workdir."""
    from hppctl.runtime.workdir import open_workdir

    write_tree(tmp_path, TREE)
    assert open_workdir(tmp_path).root == tmp_path.resolve() and sys.path[0] == str(tmp_path.resolve())
    assert open_workdir(None) is None
    assert usercode.root() is None and str(tmp_path.resolve()) not in sys.path
