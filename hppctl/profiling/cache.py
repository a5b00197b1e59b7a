"""Measurement cache: one directory per (model, granularity, settings, versions, device), files per
batch size, so a rerun measures only what it lacks and an interrupted run resumes from the last
timed pass.

    $HPPCTL_CACHE_DIR/measurements/<key>/key.json         what the key is made of (for people)
                                        /setup.json       the probe's setup record
                                        /memory-<b>.json  the `memory` record of batch size b
                                        /passes-<b>.json  the timed `pass` records of b so far (a list)
                                        /skip-<b>.json    a batch size that did not fit, with the budget then

(`$HPPCTL_CACHE_DIR`, else `$XDG_CACHE_HOME/hppctl`, else `~/.cache/hppctl`, as for the zoo.)
Every file is written atomically as soon as its record arrives. Links are not cached: a network
is not a property of the devices, and a pair takes seconds to measure.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from hppctl.store import write_text_atomic


def default_root() -> Path:
    from hppctl.zoo.cache import user_cache_dir

    return user_cache_dir() / "measurements"


def cache_key(parts: dict[str, Any]) -> str:
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class MeasurementCache:
    """Batch records of one device and model, under `root/<key>/`."""

    def __init__(self, root: Path, parts: dict[str, Any]) -> None:
        self.parts = parts
        self.dir = Path(root) / cache_key(parts)

    def _write(self, name: str, record: Any) -> None:
        if not (self.dir / "key.json").exists():
            write_text_atomic(self.dir / "key.json", json.dumps(self.parts, indent=2, sort_keys=True) + "\n")
        write_text_atomic(self.dir / name, json.dumps(record) + "\n")

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

    def passes(self, size: int) -> list[dict[str, Any]]:
        found = self._read(f"passes-{size}.json")
        return found if isinstance(found, list) else []

    def add_pass(self, record: dict[str, Any]) -> None:
        size = int(record["batch_size"])
        self._write(f"passes-{size}.json", self.passes(size) + [record])

    def forget_passes(self, size: int) -> None:
        """Drop the timed passes of `size` (they are measured again); its memory record stays."""
        self._write(f"passes-{size}.json", [])

    def complete(self, size: int, repeats: int) -> bool:
        return self.memory(size) is not None and len(self.passes(size)) >= repeats

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
