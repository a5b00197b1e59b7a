"""Measurement cache: one directory per (model, granularity, settings, versions, device), files per
batch size, so a rerun measures only what it lacks and an interrupted run resumes from the last
timed pass.

    $HPPCTL_CACHE_DIR/measurements/<key>/key.json         what the key is made of (for people)
                                        /setup.json       the probe's setup record
                                        /memory-<b>.json  the `memory` record of batch size b
                                        /passes-<b>.jsonl the timed `pass` records of b so far, a line each
                                        /skip-<b>.json    a batch size that did not fit, with the budget then

(`$HPPCTL_CACHE_DIR`, else `$XDG_CACHE_HOME/hppctl`, else `~/.cache/hppctl`, as for the zoo.)
Every file is written atomically as soon as its record arrives, except that a pass is appended to its
batch size's lines (and synced): rewriting the list for each pass cost time quadratic in the repeats;
a line torn by a crash is skipped when read, and that pass is measured again. Links are not cached: a network
is not a property of the devices, and a pair takes seconds to measure.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from hppctl.store import open_output_stream, write_text_atomic


def default_root() -> Path:
    from hppctl.zoo.cache import user_cache_dir

    return user_cache_dir() / "measurements"


def _ends_mid_line(path: Path) -> bool:
    """Whether `path` exists and its last byte is not a newline."""
    try:
        with open(path, "rb") as f:
            if f.seek(0, os.SEEK_END) == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:
        return False


def cache_key(parts: dict[str, Any]) -> str:
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class MeasurementCache:
    """Batch records of one device and model, under `root/<key>/`."""

    def __init__(self, root: Path, parts: dict[str, Any]) -> None:
        self.parts = parts
        self.dir = Path(root) / cache_key(parts)
        self._pass_counts: dict[int, int] = {}  # batch size -> passes on file, once read (complete() per pass)

    def _write(self, name: str, record: Any) -> None:
        self._write_key()
        write_text_atomic(self.dir / name, json.dumps(record) + "\n")

    def _write_key(self) -> None:
        if not (self.dir / "key.json").exists():
            write_text_atomic(self.dir / "key.json", json.dumps(self.parts, indent=2, sort_keys=True) + "\n")

    def _read(self, name: str) -> Any:
        try:
            return json.loads((self.dir / name).read_text())
        except (OSError, ValueError, RecursionError):  # RecursionError: a record edited into deep nesting
            return None  # missing, or torn by a crash before the rename: measure again

    def setup(self) -> dict[str, Any] | None:
        return self._read("setup.json")

    def store_setup(self, record: dict[str, Any]) -> None:
        self._write("setup.json", record)

    def memory(self, size: int) -> dict[str, Any] | None:
        return self._read(f"memory-{size}.json")

    def store_memory(self, record: dict[str, Any]) -> None:
        self._write(f"memory-{int(record['batch_size'])}.json", record)

    def _passes_path(self, size: int) -> Path:
        return self.dir / f"passes-{size}.jsonl"

    def passes(self, size: int) -> list[dict[str, Any]]:
        try:
            lines = self._passes_path(size).read_bytes().splitlines()
        except OSError:
            lines = []
        records = []
        for line in lines:
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                continue  # torn by a crash mid-append (or edited): that pass is measured again
            if isinstance(record, dict):
                records.append(record)
        self._pass_counts[size] = len(records)
        return records

    def add_pass(self, record: dict[str, Any]) -> None:
        """Append one timed pass of its batch size, synced before the next pass runs."""
        size = int(record["batch_size"])
        count = self._pass_count(size)
        self._write_key()
        path = self._passes_path(size)
        line = json.dumps(record) + "\n"
        if _ends_mid_line(path):  # a line torn by a crash: keep this record on a line of its own
            line = "\n" + line
        with open_output_stream(path, append=True) as f:  # refuses a symlink or a device, as the atomic writes do
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self._pass_counts[size] = count + 1

    def forget_passes(self, size: int) -> None:
        """Drop the timed passes of `size` (they are measured again); its memory record stays."""
        self._write_key()
        write_text_atomic(self._passes_path(size), "")
        self._pass_counts[size] = 0

    def _pass_count(self, size: int) -> int:
        if size not in self._pass_counts:
            self.passes(size)
        return self._pass_counts[size]

    def complete(self, size: int, repeats: int) -> bool:
        return self.memory(size) is not None and self._pass_count(size) >= repeats

    def skip(self, size: int, budget: int | None) -> dict[str, Any] | None:
        """A cached skip still holds when today's budget is no larger than the one it was decided with."""
        record = self._read(f"skip-{size}.json")
        if record is None:
            return None
        then = record.get("budget")
        if budget is None or then is None or budget <= then:
            return record
        return None

    def store_skip(self, size: int, reason: str, budget: int | None) -> None:
        self._write(f"skip-{size}.json", {"type": "skip", "batch_size": size, "reason": reason, "budget": budget})

    def clear(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self._pass_counts.clear()
