"""Load and save the typed files (JSON or YAML by extension). The only module that imports yaml.

Every load failure becomes one `BadInput` naming the file, the field and the problem; every
save is atomic (temp file in the same directory, then rename) so a failed command never
leaves a half-written file behind.
"""

from __future__ import annotations

import json
import os
import tempfile
import typing
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hppctl.errors import BadInput, RuntimeFailure

M = TypeVar("M", bound=BaseModel)


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "json"
    if suffix in (".yaml", ".yml"):
        return "yaml"
    raise BadInput(f"{path}: unknown file extension {suffix!r} (use .json, .yaml or .yml)")


def read_document(path: str | Path) -> object:
    """Parse a JSON/YAML file into plain Python data."""
    path = Path(path)
    kind = _format_of(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise BadInput(f"{path}: cannot read: {e.__class__.__name__}") from None
    try:
        return json.loads(text) if kind == "json" else yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise BadInput(f"{path}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise BadInput(f"{path}: malformed YAML{where}: {problem}") from None


def describe_validation_error(source: str, err: ValidationError) -> str:
    """`FILE: FIELD: message (got VALUE)` for the first error, plus a count of the others."""
    first = err.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "(top level)"
    message = first["msg"].removeprefix("Value error, ")
    got = first.get("input")
    shown = "" if isinstance(got, (dict, list)) or got is None or repr(got) in message else f" (got {got!r})"
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
        raise BadInput(f"{source}: kind: this is a {data['kind']!r} document; this command needs a {expected!r} one")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise BadInput(describe_validation_error(source, e)) from None


def load(path: str | Path, model: type[M]) -> M:
    return validate(model, read_document(path), str(path))


def dumps(obj: BaseModel, kind: str) -> str:
    data = obj.model_dump(mode="json")
    if kind == "json":
        return json.dumps(data, indent=2) + "\n"
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write through a temporary file beside `path` and rename it: a reader sees the old file or the new
    one, never half of one. A path that cannot be written is bad input (exit 2), named; a failure while
    writing (a full disk) a runtime failure (exit 1), with nothing left behind."""
    path = Path(path)
    if path.is_dir():
        raise BadInput(f"{path}: is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise BadInput(f"{path}: cannot write here ({e.strerror or e})") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a saved file gets normal permissions
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        raise RuntimeFailure(f"{path}: writing failed ({e.strerror or e})") from None
    except BaseException:
        os.unlink(tmp)
        raise


def save(path: str | Path, obj: BaseModel) -> None:
    path = Path(path)
    write_text_atomic(path, dumps(obj, _format_of(path)))


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
