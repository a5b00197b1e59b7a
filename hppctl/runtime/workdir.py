"""`--workdir DIR`: the user's code travels with the run.

The launcher checks DIR once (`open_workdir`: a directory, within `limits.MAX_WORKDIR_BYTES` and
`MAX_WORKDIR_FILES`, no symbolic link leaving it, nothing but files, links and directories), reads
it whole into a content hash (relative paths and bytes, `__pycache__` and `.git` left out: mtimes
and the order the file system lists them in do not count) and a gzip'd tar, and makes it the first
entry of its own import path (hppctl/usercode.py). The launcher skeleton (runtime/launcher.py)
then installs it on every SSH device over the connection that starts the device's worker, in
`~/.cache/hppctl/workdirs/<digest>/` (uploaded to a temporary name and renamed, so a directory
of that name is always complete); a device that already holds the digest gets nothing (0 bytes).
Local devices use DIR where it is. Each worker config carries a `UserCode` (the directory on that
device and the user modules of the run); the one worker life (runtime/worker_entry.py) puts the
directory first on `sys.path` and imports each module before it joins, so a module that does not
import on a device fails the run there, exit 2, naming the device, before any worker trains.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from hppctl import usercode
from hppctl.errors import BadInput
from hppctl.limits import MAX_WORKDIR_BYTES, MAX_WORKDIR_FILES
from hppctl.models.base import FrozenModel

CACHE_DIR = ".cache/hppctl/workdirs"
"""Where a device keeps the workdirs it was sent, under its SSH user's home; one directory per digest."""
EXCLUDED = frozenset({"__pycache__", ".git"})
"""Directory names left out of the hash and the archive: the interpreter's caches and the repository."""
DIGEST_CHARS = 24
"""Hex digits of the SHA-256 naming a workdir on the devices (96 bits)."""
BAD_INPUT_PREFIX = "user code does not import: "
"""How a worker's `failed/<device>` report says a user module did not import there: the run's input
is at fault (exit 2), not the worker. Not an exception's class name: a worker's own `BadInput`
mid-run (`BadInput: …`, a sample it cannot read) stays a worker failure (exit 1)."""


@dataclass(frozen=True)
class Entry:
    """One file or symbolic link of a workdir, by its path relative to the workdir."""

    path: str
    data: bytes = b""
    link: str | None = None
    """A link's target, relative to the link's directory (inside the workdir)."""


@dataclass(frozen=True)
class Workdir:
    """A checked `--workdir`: where it is, its content hash, and the archive a device is sent."""

    root: Path
    digest: str
    entries: tuple[Entry, ...]
    size: int
    """Bytes of its files."""
    archive: bytes
    """A gzip'd tar of `entries` (the bytes an SSH device is sent when it does not hold `digest`)."""

    @property
    def remote_path(self) -> str:
        """Where an SSH device holds it (`~` is the device user's home, expanded by the worker)."""
        return f"~/{CACHE_DIR}/{self.digest}"


def open_workdir(path: str | os.PathLike | None, flag: str = "--workdir") -> Workdir | None:
    """Check and read `path`, and make it this process's import root (the launcher's: pre-flight
    imports the dataset factory from it); `BadInput` naming `flag` if it cannot serve. None: no
    workdir, and none left from an earlier command of this process (`hppctl.cli.run` in bench/)."""
    if path is None:
        usercode.set_root(None)
        return None
    workdir = snapshot(path, flag)
    usercode.set_root(str(workdir.root))
    return workdir


def snapshot(path: str | os.PathLike, flag: str = "--workdir") -> Workdir:
    """The workdir at `path`, read whole: `BadInput` (one line naming `flag`) for a missing path, a
    non-directory, a symbolic link leaving it, a special file, or more than the limits hold."""
    given = Path(path)
    if not given.exists():
        raise BadInput(f"{flag}: {given}: no such directory")
    if not given.is_dir():
        raise BadInput(f"{flag}: {given}: not a directory")
    root = given.resolve()
    entries = tuple(_read_entries(root, flag))
    return Workdir(root, digest_of(entries), entries, sum(len(e.data) for e in entries), archive_of(entries))


def _read_entries(root: Path, flag: str):
    """Every file and link under `root`, sorted by relative path, checked against the limits as
    they are met (a directory of 10 GB is refused after reading at most MAX_WORKDIR_BYTES)."""
    total = count = 0
    for rel in _walk(root, flag):
        full = root / rel
        count += 1
        if count > MAX_WORKDIR_FILES:
            raise BadInput(f"{flag}: {root}: holds more than {MAX_WORKDIR_FILES:,} files (limits.MAX_WORKDIR_FILES): "
                           f"ship code, keep data and environments out of it")
        if full.is_symlink():
            yield Entry(rel, link=_inside_link(root, rel, flag))
            continue
        total += full.stat().st_size
        if total > MAX_WORKDIR_BYTES:
            raise BadInput(f"{flag}: {root}: holds more than {MAX_WORKDIR_BYTES // 2**20} MiB of files "
                           f"(limits.MAX_WORKDIR_BYTES), at {rel}: ship code, keep data out of it")
        try:
            yield Entry(rel, data=full.read_bytes())
        except OSError as e:
            raise BadInput(f"{flag}: {full}: cannot read ({e.strerror})") from None


def _walk(root: Path, flag: str) -> list[str]:
    """Relative paths (POSIX) of the files and links under `root`, sorted; excluded directories
    skipped, directories reached through a link not entered (the link itself is kept)."""
    found = []
    for directory, dirs, files in os.walk(root, followlinks=False, onerror=_unreadable(flag)):
        dirs[:] = sorted(d for d in dirs if d not in EXCLUDED)
        here = Path(directory)
        for name in [d for d in dirs if (here / d).is_symlink()] + files:
            full = here / name
            mode = full.lstat().st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                raise BadInput(f"{flag}: {full}: not a regular file, directory or link (a FIFO, socket or device "
                               f"cannot be shipped)")
            found.append(full.relative_to(root).as_posix())
    return sorted(found)


def _unreadable(flag: str):
    def fail(error: OSError) -> None:
        raise BadInput(f"{flag}: {error.filename}: cannot read ({error.strerror})")
    return fail


def _inside_link(root: Path, rel: str, flag: str) -> str:
    """A link's target relative to its directory, when it stays inside `root`; else `BadInput`."""
    full = root / rel
    target = os.readlink(full)
    resolved = Path(os.path.realpath(full))
    if resolved != root and root not in resolved.parents:
        raise BadInput(f"{flag}: {full}: symbolic link to {target} leaves {root}: copy the file in, or drop the link")
    return os.path.relpath(resolved, full.parent)


def digest_of(entries) -> str:
    """SHA-256 of the entries' relative paths and contents (links: their targets), in path order."""
    h = hashlib.sha256()
    for e in sorted(entries, key=lambda e: e.path):
        kind, body = (b"L", e.link.encode()) if e.link is not None else (b"F", e.data)
        h.update(kind + e.path.encode() + b"\0" + str(len(body)).encode() + b"\0" + body)
    return h.hexdigest()[:DIGEST_CHARS]


def archive_of(entries) -> bytes:
    """A gzip'd tar of the entries, the same bytes for the same entries (no times, owners or modes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.path)
            info.mtime = 0
            if e.link is not None:
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, e.link, 0o777
                tar.addfile(info)
            else:
                info.size, info.mode = len(e.data), 0o644
                tar.addfile(info, io.BytesIO(e.data))
    return buf.getvalue()


# --- what a worker is told, and checks before it joins ----------------------------------------------

class UserModule(FrozenModel):
    """A user module a run imports (`--dataset mod:fn`, `--model mod:factory`), and the flag naming it."""

    flag: str
    spec: str
    module: str


class UserCode(FrozenModel):
    """A worker config's `user_code`: the workdir on that device (None: no `--workdir`) and the user
    modules every device imports before it joins."""

    path: str | None = None
    modules: tuple[UserModule, ...] = ()


def prepare(code: UserCode | None, device: str) -> str | None:
    """On a worker, before it joins: the workdir first on the import path, then every user module
    imported. None when all import, else the one line that fails the run (exit 2)."""
    if code is None:
        return None
    if code.path is not None and not os.path.isdir(os.path.expanduser(code.path)):
        return f"device {device!r}: --workdir {code.path} is missing on this device"
    usercode.set_root(code.path)
    for m in code.modules:
        try:
            usercode.import_module(m.module)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - anything a module raises at import is its failure
            reason = " ".join(f"{e.__class__.__name__}: {e}".split())[:500]
            hint = "" if code.path else "; --workdir DIR ships the directory holding it to every device"
            return f"device {device!r}: {m.flag} {m.spec}: cannot import {m.module!r} on that device ({reason}){hint}"
    return None


# --- the launcher's side ------------------------------------------------------------------------------

@dataclass
class RunUserCode:
    """A run's user code on the launcher: the workdir (or None) and the modules to check, and what
    each device was sent (`sent[device]`: bytes, 0 when it held the digest, None: local)."""

    workdir: Workdir | None
    modules: tuple[UserModule, ...]
    sent: dict[str, int | None] = field(default_factory=dict)

    def for_device(self, local: bool) -> UserCode:
        path = None if self.workdir is None else (str(self.workdir.root) if local else self.workdir.remote_path)
        return UserCode(path=path, modules=self.modules)

    def summary(self) -> dict | None:
        """The `--json` summary's `workdir` field (None without `--workdir`)."""
        if self.workdir is None:
            return None
        return {"path": str(self.workdir.root), "digest": self.workdir.digest, "files": len(self.workdir.entries),
                "bytes": self.workdir.size, "archive_bytes": len(self.workdir.archive),
                "sent_bytes": dict(self.sent), "sent_total_bytes": sum(v or 0 for v in self.sent.values())}

    def line(self) -> str | None:
        """One line for people: `workdir: 12.30 KB sent to nano0; cached on nano1; local on a`."""
        if self.workdir is None:
            return None
        from hppctl.models.units import format_bytes

        sent = [(d, n) for d, n in self.sent.items() if n]
        cached = [d for d, n in self.sent.items() if n == 0]
        local = [d for d, n in self.sent.items() if n is None]
        parts = [f"{format_bytes(n)} sent to {d}" for d, n in sent]
        parts += [f"cached on {', '.join(cached)}"] if cached else []
        parts += [f"used in place on {', '.join(local)}"] if local else []
        return f"workdir {self.workdir.digest[:12]} ({len(self.workdir.entries)} files, " \
               f"{format_bytes(self.workdir.size)}): " + "; ".join(parts)


def user_code(workdir: Workdir | None, **specs: str | None) -> RunUserCode | None:
    """The run's user code from its workdir and the values of the flags that may name user modules
    (`dataset="mod:fn"`; the model's `model="mod:factory"` joins the same way). None when there is
    neither a workdir nor a user module: the workers are told nothing."""
    modules: dict[str, UserModule] = {}
    for name, spec in specs.items():
        module = usercode.module_of(spec) if spec else None
        if module is not None and module not in modules:
            modules[module] = UserModule(flag=f"--{name.replace('_', '-')}", spec=spec, module=module)
    if workdir is None and not modules:
        return None
    return RunUserCode(workdir, tuple(modules.values()))


def install(conn, workdir: Workdir, python: str) -> int:
    """Make `workdir` present on the SSH device behind `conn` (opened); the bytes sent (0: it was)."""
    from hppctl.ssh import install_cached

    return install_cached(conn, CACHE_DIR, workdir.digest, workdir.archive, python)
