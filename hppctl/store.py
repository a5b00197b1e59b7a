"""Load and save the typed files (JSON or YAML by extension). The only module that imports yaml.

Every load failure becomes one `BadInput` naming the file, the field and the problem; every
save is atomic (temp file in the same directory, then rename) so a failed command never
leaves a half-written file behind.

File rules (docs/formats.md, Limits): an input must be a regular file no bigger than the limit
of its format, checked before it is read, so a FIFO or a device never blocks and a 200 MB file is
refused at once; an output path must be a regular file or missing, so a rename never replaces a
device, a symlink or anything else that is not ours to replace, and a streamed output (a log, a
metrics file) is never written through a symlink, into a device or a FIFO.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import tempfile
import typing
from pathlib import Path
from typing import BinaryIO, Iterator, TextIO, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hppctl.errors import BadInput, RuntimeFailure, shorten
from hppctl.limits import (MAX_DOCUMENT_VALUES_PER_BYTE, MAX_FILE_BYTES, MAX_NESTING, MAX_VALUE_CHARS,
                           MAX_YAML_BYTES)

M = TypeVar("M", bound=BaseModel)

__all__ = ["atomic_output", "check_output_path", "describe_validation_error", "dumps", "load", "open_output_stream",
           "read_document", "read_input_bytes", "save", "shorten", "validate", "write_bytes_atomic", "write_text_atomic"]


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "json"
    if suffix in (".yaml", ".yml"):
        return "yaml"
    raise BadInput(f"{path}: unknown file extension {shorten(suffix)!r} (use .json, .yaml or .yml)")


def _why(err: OSError) -> str:
    """`No such file or directory`, `Too many levels of symbolic links`, … (never the path again)."""
    return err.strerror or str(err) or err.__class__.__name__


def _kind_of_file(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def read_input_bytes(path: str | Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a user's input file: a regular file of at most `limit` bytes, else `BadInput`
    naming the file. Opened non-blocking and checked with fstat before any read, so a FIFO or a
    device is refused instead of blocking; at most `limit` + 1 bytes are ever read (a file that
    grows while we read is refused too)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file") from None
    except OSError as e:
        raise BadInput(f"{path}: cannot read ({_why(e)})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadInput(f"{path}: cannot read ({_kind_of_file(info.st_mode)}, not a regular file)")
        if info.st_size > limit:
            raise BadInput(f"{path}: file is {info.st_size} bytes, more than the limit of {limit} (docs/formats.md, Limits)")
        return _read_at_most(fd, path, limit)
    finally:
        os.close(fd)


def _read_at_most(fd: int, path: Path, limit: int) -> bytes:
    chunks, total = [], 0
    try:
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as e:  # EIO from a failing disk, EISDIR on odd file systems
        raise BadInput(f"{path}: cannot read ({_why(e)})") from None
    if total > limit:
        raise BadInput(f"{path}: file is more than the limit of {limit} bytes (docs/formats.md, Limits)")
    return b"".join(chunks)


def read_document(path: str | Path) -> object:
    """Parse a JSON/YAML file into plain Python data, within the limits of docs/formats.md."""
    path = Path(path)
    kind = _format_of(path)
    raw = read_input_bytes(path, MAX_FILE_BYTES if kind == "json" else MAX_YAML_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}: cannot read: not UTF-8 text (byte {e.start})") from None
    data = _parse(path, kind, text)
    _check_shape(path, data, budget=MAX_DOCUMENT_VALUES_PER_BYTE * len(text) + 16)
    return data


def _parse(path: Path, kind: str, text: str) -> object:
    try:
        return json.loads(text) if kind == "json" else yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise BadInput(f"{path}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise BadInput(f"{path}: malformed YAML{where}: {shorten(problem)}") from None
    except RecursionError:  # the parsers recurse per level: 10⁵ nested `[` exhaust the stack
        raise BadInput(f"{path}: nested more than {MAX_NESTING} levels deep (docs/formats.md, Limits)") from None
    except (ValueError, OverflowError) as e:  # json: a number too long to convert; yaml: a bad timestamp
        raise BadInput(f"{path}: malformed {kind.upper()}: {shorten(str(e))}") from None


_SCALARS = frozenset({float, int, str, bool, type(None)})


def _check_shape(path: Path, data: object, budget: int) -> None:
    """Refuse nesting deeper than MAX_NESTING, and YAML aliases that expand a document into more
    values than it has bytes, before validation walks it (recursively, and once per alias)."""
    if not isinstance(data, (dict, list)):
        return
    stack: list[tuple[dict | list, int]] = [(data, 1)]
    values = 1
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        values += len(children)
        if values > budget:
            raise BadInput(f"{path}: expands to more values than it has bytes (YAML aliases?) (docs/formats.md, Limits)")
        if _SCALARS.issuperset(map(type, children)):  # a row of numbers: most of a profile, checked at C speed
            continue
        containers = [child for child in children if isinstance(child, (dict, list))]  # scalars need no visit
        if containers and depth >= MAX_NESTING:
            raise BadInput(f"{path}: nested more than {MAX_NESTING} levels deep (docs/formats.md, Limits)")
        stack.extend((child, depth + 1) for child in containers)


def describe_validation_error(source: str, err: ValidationError) -> str:
    """`FILE: FIELD: message (got VALUE)` for the first error, plus a count of the others."""
    first = err.errors()[0]
    field = shorten(".".join(str(part) for part in first["loc"]) or "(top level)")  # keys are user text too
    message = first["msg"].removeprefix("Value error, ")
    got = first.get("input")
    message = shorten(message, 4 * MAX_VALUE_CHARS)  # a pydantic message may quote the value itself
    shown = "" if isinstance(got, (dict, list)) or got is None or repr(got) in message else f" (got {shorten(repr(got))})"
    more = len(err.errors()) - 1
    suffix = f" [and {more} more error{'s' if more > 1 else ''}]" if more else ""
    return f"{source}: {field}: {message}{shown}{suffix}"


def _expected_kind(model: type[BaseModel]) -> str | None:
    """The fixed `kind` of a document model (plans: hpp, psl, inference), or None."""
    field = model.model_fields.get("kind")
    if field is None or typing.get_origin(field.annotation) is not typing.Literal:
        return None
    values = typing.get_args(field.annotation)
    return values[0] if len(values) == 1 else None


def validate(model: type[M], data: object, source: str) -> M:
    if not isinstance(data, dict):
        raise BadInput(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    expected = _expected_kind(model)
    if expected is not None and isinstance(data.get("kind"), str) and data["kind"] != expected:
        # One line for a whole document of the wrong kind, not its first of 28 field errors.
        raise BadInput(f"{source}: kind: this is a {shorten(repr(data['kind']))} document; this command needs a {expected!r} one")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise BadInput(describe_validation_error(source, e)) from None
    except RecursionError:  # data built in code, not read by read_document (which bounds nesting)
        raise BadInput(f"{source}: nested more than {MAX_NESTING} levels deep") from None


def load(path: str | Path, model: type[M]) -> M:
    return validate(model, read_document(path), str(path))


def dumps(obj: BaseModel, kind: str) -> str:
    data = obj.model_dump(mode="json")
    if kind == "json":
        return json.dumps(data, indent=2) + "\n"
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)


def check_output_path(path: str | Path) -> Path:
    """`path` if hppctl may replace it: missing, or a regular file. Anything else (a symlink, a
    device like /dev/null, a FIFO, a directory) is refused as `BadInput` naming it, because the
    atomic rename would replace the thing itself: as root, `--trace /dev/null` replaced /dev/null
    with a regular file, and a symlink would be swapped for a file instead of followed."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as e:  # a name too long, a path through a file, a symlink loop on the way
        raise BadInput(f"{path}: cannot write here ({_why(e)})") from None
    if stat.S_ISLNK(info.st_mode):
        raise BadInput(f"{path}: is a symlink; hppctl replaces output files, give the path it points to")
    if stat.S_ISDIR(info.st_mode):
        raise BadInput(f"{path}: is a directory")
    if not stat.S_ISREG(info.st_mode):
        raise BadInput(f"{path}: is {_kind_of_file(info.st_mode)}, not a regular file; hppctl only replaces regular files")
    return path


def open_output_stream(path: str | Path, *, append: bool = False) -> TextIO:
    """A text file to stream lines into (`--log`, `--metrics`, `--events`): appended to, or emptied
    first unless `append`. Unlike `open(path, "w")` it never follows a symlink (which emptied the
    link's target), never blocks on a FIFO and never writes into a device: the path is checked as
    `check_output_path` does, then opened with O_NOFOLLOW | O_NONBLOCK, and emptied only once fstat
    on the open file says it is a regular file (the path may have changed between the two)."""
    path = check_output_path(path)
    flags = (os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
             | (os.O_APPEND if append else 0))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        raise BadInput(_refusal_on_open(path, e)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadInput(f"{path}: is {_kind_of_file(info.st_mode)}, not a regular file; hppctl writes only regular files")
        if not append:
            os.ftruncate(fd, 0)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)  # a full disk waits, not EAGAIN
        return os.fdopen(fd, "a" if append else "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def _refusal_on_open(path: Path, err: OSError) -> str:
    """Why `open_output_stream` could not open `path`: O_NOFOLLOW fails with ELOOP on a symlink, and a
    non-blocking write-only open of a FIFO nobody reads with ENXIO."""
    if err.errno == errno.ELOOP and os.path.islink(path):
        return f"{path}: is a symlink; hppctl does not write through one, give the path it points to"
    if err.errno == errno.ENXIO:
        return f"{path}: is a FIFO, not a regular file; hppctl writes only regular files"
    return f"{path}: cannot write here ({_why(err)})"


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file to write `path` through: a temporary file beside it, renamed over it when the
    block ends without an error, removed otherwise. A reader sees the old file or the new one, never
    half of one. A path that cannot be written is bad input (exit 2), named (see
    `check_output_path`); a failure while writing (a full disk) a runtime failure (exit 1), with
    nothing left behind."""
    path = check_output_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:64]}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise BadInput(f"{path}: cannot write here ({_why(e)})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a saved file gets normal permissions
        check_output_path(path)  # it may have become a symlink or a device while we wrote
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        raise RuntimeFailure(f"{path}: writing failed ({_why(e)})") from None
    except BaseException:
        os.unlink(tmp)
        raise


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` atomically (see `atomic_output`)."""
    with atomic_output(path) as f:
        f.write(data)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically (see `atomic_output`)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def save(path: str | Path, obj: BaseModel) -> None:
    path = Path(path)
    write_text_atomic(path, dumps(obj, _format_of(path)))


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
