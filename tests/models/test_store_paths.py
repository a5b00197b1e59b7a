"""store's file rules (issue 23 items 5, 7, 8) below the CLI: every writer and reader goes through them."""

from __future__ import annotations

import fcntl
import os
import stat

import pytest

from hppctl import store
from hppctl.errors import BadInput
from hppctl.store import atomic_output, open_output_stream, read_input_bytes, write_bytes_atomic


def _not_regular(tmp_path):
    (tmp_path / "victim").write_text("keep me\n")
    (tmp_path / "link").symlink_to(tmp_path / "victim")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    names = ["link", "fifo", "dir"]
    if os.geteuid() == 0:
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        names.append("null")
    return names


def test_writers_refuse_anything_but_a_regular_file_and_leave_nothing(tmp_path):
    for name in _not_regular(tmp_path):
        before = os.lstat(tmp_path / name)
        with pytest.raises(BadInput, match=f"^{tmp_path / name}: is "):
            write_bytes_atomic(tmp_path / name, b"x")
        assert os.lstat(tmp_path / name).st_ino == before.st_ino
    assert (tmp_path / "victim").read_text() == "keep me\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_failing_writer_body_leaves_no_temporary(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with atomic_output(tmp_path / "out.png") as f:
            f.write(b"half")
            1 / 0
    assert list(tmp_path.iterdir()) == []


def test_a_target_swapped_for_a_symlink_while_writing_is_not_replaced(tmp_path):
    (tmp_path / "victim").write_text("keep me\n")
    with pytest.raises(BadInput, match="is a symlink"):
        with atomic_output(tmp_path / "out.json") as f:
            f.write(b"{}")
            (tmp_path / "out.json").symlink_to(tmp_path / "victim")
    assert (tmp_path / "victim").read_text() == "keep me\n" and os.path.islink(tmp_path / "out.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "victim"]


def test_read_input_bytes_refuses_without_blocking_and_within_the_limit(tmp_path):
    _not_regular(tmp_path)
    assert read_input_bytes(tmp_path / "link") == b"keep me\n"  # a symlink to a regular file is read
    for name, reason in (("fifo", "a FIFO"), ("dir", "a directory")):
        with pytest.raises(BadInput, match=f"cannot read \\({reason}, not a regular file\\)"):
            read_input_bytes(tmp_path / name)
    with pytest.raises(BadInput, match="more than the limit of 4"):
        read_input_bytes(tmp_path / "victim", limit=4)


@pytest.mark.parametrize("checked_first", [True, False], ids=["checked", "swapped-after-the-check"])
def test_open_output_stream_never_follows_a_symlink_blocks_or_writes_a_device(tmp_path, monkeypatch, checked_first):
    """`--log`/`--metrics` were `open(path, "a"/"w")`: "w" on a symlink emptied its target, a FIFO
    blocked. Without the path check (a path swapped after it), O_NOFOLLOW and fstat still refuse."""
    names = _not_regular(tmp_path)
    if not checked_first:
        monkeypatch.setattr(store, "check_output_path", lambda path: path)
    reader = os.open(tmp_path / "fifo", os.O_RDONLY | os.O_NONBLOCK)  # with a reader, opening a FIFO succeeds
    try:
        for name in names:
            for append in (False, True):
                before = os.lstat(tmp_path / name)
                with pytest.raises(BadInput, match=f"^{tmp_path / name}: "):
                    open_output_stream(tmp_path / name, append=append)
                after = os.lstat(tmp_path / name)
                assert (after.st_ino, after.st_mode, after.st_rdev) == (before.st_ino, before.st_mode, before.st_rdev)
    finally:
        os.close(reader)
    assert (tmp_path / "victim").read_text() == "keep me\n"


def test_open_output_stream_without_a_reader_on_the_fifo_does_not_block(tmp_path, monkeypatch):
    os.mkfifo(tmp_path / "fifo")
    monkeypatch.setattr(store, "check_output_path", lambda path: path)
    with pytest.raises(BadInput, match="is a FIFO"):
        open_output_stream(tmp_path / "fifo", append=True)


def test_open_output_stream_appends_or_empties_regular_files_and_blocks_again(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("old\n")
    with open_output_stream(log, append=True) as f:
        assert not fcntl.fcntl(f.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK  # a full pipe or disk waits, no EAGAIN
        f.write("new\n")
    assert log.read_text() == "old\nnew\n"
    with open_output_stream(log) as f:
        f.write("only\n")
    assert log.read_text() == "only\n"
    with open_output_stream(tmp_path / "sub" / "m.jsonl") as f:  # its folder is made, as before
        f.write("{}\n")
    assert (tmp_path / "sub" / "m.jsonl").read_text() == "{}\n"
