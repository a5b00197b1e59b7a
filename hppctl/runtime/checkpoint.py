"""Checkpoint directories: per-stage files written atomically, complete rounds marked last, one run at a time.

Layout (the launcher writes it; workers send their stage state through the run's store, so it
works the same for local and SSH workers):

    DIR/LOCK                        held (flock) by the run using DIR; names its pid, host and start
    DIR/round-00000010/stage-0.pt   {"round", "stage", "layers", "model", "optimizer"} (torch.save)
    DIR/round-00000010/stage-1.pt
    DIR/round-00000010/COMPLETE.json  written last: the round counts only once it exists

Every file is written to a temporary name (`mkstemp`: unpredictable, created exclusively), fsynced
and renamed, so a run killed at any moment leaves either a complete round or an incomplete one that
`--resume` ignores. The newest `KEEP` complete rounds are kept. `COMPLETE.json` records what a
resumed run must agree on (plan, dataset, seed, optimizer, …): resuming with anything else is
refused, naming the field; and the SHA-256 of every stage file (`sha256`), checked before a resumed
run starts its workers (docs/formats.md, "Checkpoint directory").

`LOCK` is opened without following a symbolic link and never truncated before it is held: a `LOCK`
that is a link, a hard link or not a regular file is refused (exit 2), so the lock cannot be used
to empty another file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import time
from pathlib import Path

from hppctl.errors import BadInput, LockHeld, first_line
from hppctl.store import write_bytes_atomic, write_text_atomic

KEEP = 2
COMPLETE = "COMPLETE.json"
HPP_KIND = "hpp"
"""The `kind` of a round whose COMPLETE.json records none: a layer-wise (or Bi-Partition) run's; a PSL run
records "psl" (runtime/psl/checkpoint.py)."""
_KIND_NAMES = {HPP_KIND: "training plan's run (`hppctl run`)", "psl": "psl plan's run (`hppctl psl run`)"}
DIGESTS = "sha256"
"""COMPLETE.json key: {"stage-0.pt": "<64 hex digits>", …}, the SHA-256 of each stage file."""
MAX_META_BYTES = 64 * 2**20
"""A COMPLETE.json larger than this is not one hppctl wrote (a plan of 10^5 stages is ~30 MB)."""
_HEX64 = re.compile(r"[0-9a-f]{64}")


class CheckpointLocked(LockHeld):
    """Another run holds the checkpoint directory (exit 75: another run is active, try later)."""


def _round_dir(root: Path, round_index: int) -> Path:
    return root / f"round-{round_index:08d}"


def stage_file_name(stage: int) -> str:
    return f"stage-{stage}.pt"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_regular_file(path: Path, limit: int | None = None) -> bytes:
    """The bytes of `path`, which must be a regular file (`BadInput` otherwise, naming it).

    Opened non-blocking and checked with fstat before reading, so a FIFO or a device planted in a
    checkpoint directory is refused instead of blocking the run forever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BadInput(f"--resume: {path}: missing (the round's {COMPLETE} lists it)") from None
    except OSError as e:
        raise BadInput(f"--resume: {path}: cannot read ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadInput(f"--resume: {path}: not a regular file")
        if limit is not None and info.st_size > limit:
            raise BadInput(f"--resume: {path}: {info.st_size} bytes, more than the {limit} a checkpoint file "
                           f"of this kind can hold")
        try:
            return f.read()
        except OSError as e:
            raise BadInput(f"--resume: {path}: cannot read ({e.strerror or e})") from None


def open_lock_file(path: Path) -> int:
    """A descriptor on the lock file `path`, created if missing, never truncated here.

    O_NOFOLLOW: a symbolic link at `path` is refused, not followed (it used to let the lock empty
    the file it pointed to). A hard link (more than one name) or anything but a regular file is
    refused too: truncating it once held would empty that other name's content."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise BadInput(f"--checkpoint-dir: {path}: is a symbolic link; the lock must be a regular file "
                           f"(remove the link)") from None
        raise BadInput(f"--checkpoint-dir: {path}: cannot open the lock file ({e.strerror or e})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        what = "has other hard links" if stat.S_ISREG(info.st_mode) else "is not a regular file"
        raise BadInput(f"--checkpoint-dir: {path}: {what}; the lock must be a regular file of its own (remove it)")
    return fd


def check_lock_file(path: Path) -> None:
    """Refuse (`BadInput`) a `LOCK` that `open_lock_file` would refuse, without creating or opening it:
    the CLI calls this before it starts anything."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise BadInput(f"--checkpoint-dir: {path}: cannot inspect the lock file ({e.strerror or e})") from None
    if stat.S_ISLNK(info.st_mode):
        raise BadInput(f"--checkpoint-dir: {path}: is a symbolic link; the lock must be a regular file "
                       f"(remove the link)")
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        what = "has other hard links" if stat.S_ISREG(info.st_mode) else "is not a regular file"
        raise BadInput(f"--checkpoint-dir: {path}: {what}; the lock must be a regular file of its own (remove it)")


class CheckpointDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None

    # --- the lock ---------------------------------------------------------------------------------
    def lock(self) -> None:
        """Take the directory's lock or raise `CheckpointLocked` naming the holder; nothing if this
        object holds it already (the CLI takes it before its first output, `Session.run` again)."""
        if self._lock_fd is not None:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        fd = open_lock_file(self.path / "LOCK")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise CheckpointLocked(f"--checkpoint-dir {self.path}: in use by another run ({holder}); "
                                   f"two runs must not share a checkpoint directory") from None
        os.ftruncate(fd, 0)  # our own regular file (open_lock_file), now held: the last holder's line goes
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.ftruncate(self._lock_fd, 0)
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- rounds -----------------------------------------------------------------------------------
    def write_round(self, round_index: int, stages: dict[int, bytes], meta: dict) -> Path:
        """Write every stage file, then the marker; prune old rounds."""
        where = _round_dir(self.path, round_index)
        where.mkdir(parents=True, exist_ok=True)
        for p, blob in sorted(stages.items()):
            write_bytes_atomic(where / stage_file_name(p), blob)
        digests = {stage_file_name(p): sha256_hex(blob) for p, blob in sorted(stages.items())}
        write_text_atomic(where / COMPLETE, json.dumps({**meta, "round": round_index, "stages": sorted(stages),
                                                        DIGESTS: digests, "written_at": time.time()},
                                                       indent=2) + "\n")
        self._prune()
        return where

    def complete_rounds(self) -> list[int]:
        rounds = []
        if not self.path.is_dir():
            return rounds
        for child in self.path.iterdir():
            if child.name.startswith("round-") and (child / COMPLETE).exists():
                with contextlib.suppress(ValueError):  # not a round's number: not a round
                    rounds.append(int(child.name.removeprefix("round-")))
        return sorted(rounds)

    def newest_round_number(self) -> int:
        """The newest complete round's number, 0 if there is none (no run writes round 0). Its files
        are not read: `newest_round` checks them."""
        rounds = self.complete_rounds()
        return rounds[-1] if rounds else 0

    def _prune(self) -> None:
        complete = self.complete_rounds()
        for r in complete[:-KEEP]:
            shutil.rmtree(_round_dir(self.path, r), ignore_errors=True)
        newest = complete[-1] if complete else -1
        for child in self.path.iterdir():  # leftovers of a run killed while writing
            if child.name.startswith("round-") and not (child / COMPLETE).exists():
                with contextlib.suppress(ValueError):
                    if int(child.name.removeprefix("round-")) < newest:
                        shutil.rmtree(child, ignore_errors=True)

    def newest_meta(self) -> dict | None:
        """What the newest complete round records (COMPLETE.json), with its path as `_file`; None: no round."""
        rounds = self.complete_rounds()
        if not rounds:
            return None
        where = _round_dir(self.path, rounds[-1]) / COMPLETE
        return {**read_meta(where, rounds[-1]), "_file": str(where)}

    def newest_round(self, expected: dict) -> tuple[Path, dict, dict[int, bytes]] | None:
        """The newest complete round as (its directory, its COMPLETE.json, its stage files), for a run
        whose settings are `expected`; None: no round. `BadInput` naming the file if a setting but the
        plan differs, or a stage file is missing, not a regular file, or not what its digest says."""
        rounds = self.complete_rounds()
        if not rounds:
            return None
        where = _round_dir(self.path, rounds[-1])
        meta = read_meta(where / COMPLETE, rounds[-1])
        check_kind(where / COMPLETE, meta, expected.get("kind", HPP_KIND))
        for key, value in expected.items():
            if key != "plan" and meta.get(key) != value:
                raise BadInput(f"--resume: {where / COMPLETE}: {key} is {meta.get(key)!r}, this run has {value!r}; "
                               f"resume with the same settings or use another --checkpoint-dir")
        blobs = {p: read_regular_file(where / stage_file_name(p)) for p in meta["stages"]}
        for p, blob in blobs.items():
            check_digest(where / stage_file_name(p), blob, meta)
        return where, meta, blobs

    def latest(self, expected: dict) -> tuple[int, dict[int, bytes]] | None:
        """The newest complete round (its number and stage files) for a run whose settings are `expected`.

        Its settings must match, but for the plan: a plan of the same model, granularity and global
        batch gets the round's state re-cut to its own stages (`recut`), so that a run can continue
        on another plan (a device back, a re-profiled cluster) without losing what it learned.
        The stage files' content (loadable, shapes, finite) is checked before this, by the CLI
        (runtime/preflight.py: `check_checkpoint`), before the run takes the lock."""
        found = self.newest_round(expected)
        if found is None:
            return None
        where, meta, blobs = found
        old, new = meta.get("plan"), expected.get("plan")
        if new is None or (old == new and not needs_recut(new)):
            return meta["round"], blobs
        refuse_unless_recuttable(where / COMPLETE, old, new)
        return meta["round"], recut(blobs, old, new)


def is_checkpoint_round(completed: int, every: int, total: int) -> bool:
    """Whether the state after `completed` of `total` rounds is written as a checkpoint round
    (`--checkpoint-every` = `every`; 0: never). The state after the last round is the final one."""
    return bool(every) and completed % every == 0 and completed < total


def checkpoint_rounds(after: int, every: int, total: int) -> set[int]:
    """The checkpoint rounds a run of `total` rounds writes after round `after`."""
    return {c for c in range(after + 1, total) if is_checkpoint_round(c, every, total)}


def check_expected_start(checkpoint_dir: object, expected: int | None, start_round: int) -> None:
    """The CLI counted `--more-rounds` from the newest round before the lock was held; a run that
    held it meanwhile may have written a newer one (`CheckpointLocked`, exit 75, as if it still held
    the lock). `expected` None: the run gave its total, nothing was counted."""
    if expected is not None and start_round != expected:
        raise CheckpointLocked(f"--checkpoint-dir {checkpoint_dir}: another run wrote round {start_round} after "
                               f"this one counted its rounds from round {expected}; try again")


def check_kind(path: Path, meta: dict, wanted: str) -> None:
    """`BadInput` unless the round `meta` records (its COMPLETE.json at `path`) was written by a run of
    kind `wanted`: a psl round's files are devices' states, a layer-wise round's are stages'."""
    kind = meta.get("kind", HPP_KIND)
    if kind != wanted:
        raise BadInput(f"--resume: {path}: written by a {_KIND_NAMES[kind]}; this is a {_KIND_NAMES[wanted]}, "
                       f"which cannot start from its files: give another directory")


def check_digest(path: Path, blob: bytes, meta: dict) -> None:
    """`BadInput` naming `path` if its SHA-256 is not the one its round's COMPLETE.json records.
    Rounds written before digests existed record none: `read_meta` accepts them (see its docstring)."""
    recorded = meta.get(DIGESTS, {}).get(path.name)
    if recorded is None:
        return
    actual = sha256_hex(blob)
    if actual != recorded:
        raise BadInput(f"--resume: {path}: SHA-256 {actual[:16]}… ({len(blob)} bytes) is not the {recorded[:16]}… "
                       f"{COMPLETE} records: the file changed after it was written (truncated or altered)")


def read_meta(path: Path, round_index: int) -> dict:
    """A round's COMPLETE.json, checked: `BadInput` naming the file and the field for anything that
    is not what `write_round` writes (malformed JSON, not an object, missing or wrong fields, a plan
    or lineage that does not validate), so that no later step meets a malformed record.

    Rounds written before stage digests existed have no `sha256` field; they are accepted (their
    stage files are still loaded safely and checked for shapes and finite values before workers
    start) and the CLI says so in a note."""
    try:
        meta = json.loads(read_regular_file(path, MAX_META_BYTES).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"--resume: {path}: malformed JSON ({first_line(e)}); the round is damaged: remove "
                       f"{path.parent} to resume from the round before, if one is kept") from None
    except RecursionError:
        raise BadInput(f"--resume: {path}: nested too deeply to be a checkpoint record") from None
    if not isinstance(meta, dict):
        raise BadInput(f"--resume: {path}: expected a JSON object at the top level, got {type(meta).__name__}")
    _check_meta_fields(path, meta, round_index)
    return meta


def _check_meta_fields(path: Path, meta: dict, round_index: int) -> None:
    def bad(field: str, what: str) -> BadInput:
        return BadInput(f"--resume: {path}: {field}: {what} (got {short_repr(meta.get(field))})")

    if meta.get("round") != round_index or type(meta.get("round")) is not int:
        raise bad("round", f"must be {round_index}, the round its directory names")
    stages = meta.get("stages")
    if (not isinstance(stages, list) or not stages or any(type(p) is not int for p in stages)
            or stages != list(range(len(stages)))):
        raise bad("stages", "must list the stage numbers 0, 1, … in order")
    if "kind" in meta and not (isinstance(meta["kind"], str) and meta["kind"] in _KIND_NAMES):
        raise bad("kind", f"must be one of {', '.join(_KIND_NAMES)}")
    if "plan" in meta:
        _check_meta_plan(path, meta["plan"], len(stages))
    if "origin_plan" in meta and not (isinstance(meta["origin_plan"], str)
                                      and re.fullmatch(r"sha256:[0-9a-f]{16}", meta["origin_plan"])):
        raise bad("origin_plan", "must be a plan digest, sha256: and 16 hex digits")
    if "lost" in meta and not (isinstance(meta["lost"], list) and all(isinstance(d, str) for d in meta["lost"])):
        raise bad("lost", "must be a list of device names")
    if DIGESTS in meta:
        digests = meta[DIGESTS]
        names = {stage_file_name(p) for p in stages}
        if not (isinstance(digests, dict) and set(digests) == names
                and all(isinstance(v, str) and _HEX64.fullmatch(v) for v in digests.values())):
            raise bad(DIGESTS, f"must map {', '.join(sorted(names))} to 64 hex digits each")


def _check_meta_plan(path: Path, document: object, stage_count: int) -> None:
    from hppctl.models.plan import HppPlan
    from hppctl.store import validate

    plan = validate(HppPlan, document, f"--resume: {path}: plan")
    if len(plan.stages) != stage_count:
        raise BadInput(f"--resume: {path}: stages: {stage_count} stage files for a plan of {len(plan.stages)} stages")


def short_repr(value: object) -> str:
    """`repr(value)`, at most 80 characters: an error line never echoes a whole file."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def refuse_unless_recuttable(source: object, old: object, new: dict) -> None:
    """`BadInput` naming both plans' stages if a checkpoint of plan `old` cannot seed plan `new`."""
    reason = why_not_recut(old, new)
    if reason:
        raise BadInput(f"--resume: {source}: written by another plan ({_stages_text(old)}), this run's is "
                       f"{_stages_text(new)}, and {reason}; resume with that plan, or the plan the run was "
                       f"started with if fault tolerance re-planned it, or use another --checkpoint-dir")


def why_not_recut(old: object, new: dict) -> str | None:
    """Why a checkpoint of plan `old` cannot seed plan `new` (documents), or None if it can."""
    if not isinstance(old, dict):
        return "the checkpoint names no plan"
    for key in ("model", "granularity", "global_batch"):
        if old.get(key) != new.get(key):
            return f"its {key} is {old.get(key)!r} where this run's is {new.get(key)!r}"
    ends = [plan["stages"][-1]["layers"][1] for plan in (old, new)]
    if ends[0] != ends[1]:  # a record cut past the model (recut would fail on it, not refuse it)
        return f"its stages end at layer {ends[0]} where this run's end at {ends[1]}"
    return None


def needs_recut(new: dict | None) -> bool:
    """Whether a round must be re-cut even for the plan that wrote it: a Bi-Partition worker's file
    holds the parameters it steps and the buffers of the layers it forwards (so a round's files join
    into the model without overlap), and a resumed worker needs every tensor of the layers it holds."""
    return new is not None and any(s.get("backward_layers") for s in new["stages"])


class StageTensors:
    """What a stage of a plan document holds, by the model's tensor names, from stages built on the
    meta device (shapes only: nothing is allocated)."""

    def __init__(self, plan: dict) -> None:
        from hppctl.zoo import get_model

        self.granularity = plan["granularity"]
        self.whole = get_model(plan["model"]).build(device="meta").train()

    def module(self, start: int, end: int):
        """Layers [start, end) as a stage module; an empty module for an empty range (a Bi-Partition
        worker may backward no layer: the tail's whose backward its neighbour runs)."""
        import torch

        from hppctl.zoo import build_stage

        if start == end:
            return torch.nn.Module()
        return build_stage(self.whole, self.granularity, start, end, mode="train")

    def stepped(self, stage: dict) -> list[str]:
        """The parameters the stage steps, in its optimizer's order: those of the layers it backwards."""
        return [n for n, _ in self.module(*backward_layers(stage)).named_parameters()]

    def written(self, stage: dict) -> dict[str, tuple[int, ...]]:
        """Name -> shape of each tensor in the stage's checkpoint file: its layers' parameters and
        buffers; under Bi-Partition, the parameters it steps and the buffers of the layers it forwards."""
        forward = self.module(*stage["layers"])
        if not stage.get("backward_layers"):
            return {n: tuple(t.shape) for n, t in forward.state_dict().items()}
        backward = self.module(*stage["backward_layers"])
        return {**{n: tuple(t.shape) for n, t in backward.named_parameters()},
                **{n: tuple(t.shape) for n, t in forward.named_buffers()}}

    def held(self, stage: dict) -> list[str]:
        """The tensors a worker of the stage loads on resume: those of every layer it holds (both
        ranges under Bi-Partition), as its module's `state_dict` names them."""
        return list(self.module(*held_layers(stage)).state_dict())


def held_layers(stage: dict) -> tuple[int, int]:
    """The layers a worker of a stage (plan document) holds: under Bi-Partition, both its ranges."""
    from hppctl.runtime.bipartition import union_layers

    return union_layers(stage["layers"], stage.get("backward_layers"))


def backward_layers(stage: dict) -> tuple[int, int]:
    """The layers a stage (plan document) backwards: its own unless Bi-Partition gives it others."""
    return tuple(stage.get("backward_layers") or stage["layers"])


def recut(blobs: dict[int, bytes], old: dict, new: dict) -> dict[int, bytes]:
    """The stage files of plan document `old` re-cut to the stages of `new` (same model and granularity),
    layer-wise or Bi-Partition either way.

    Parameters and buffers are named the same in every stage (the model's names), so they are
    joined and split by the new stages' names: each new stage gets every tensor of the layers it
    holds. The optimizer's state is kept per parameter *index* of its stage (torch's `state_dict`);
    the indices are mapped through the parameters each stage steps (`StageTensors.stepped`)."""
    import io

    import torch

    layout = StageTensors(new)
    tensors, per_param, groups, rounds = {}, {}, None, set()
    for p, blob in blobs.items():
        state = torch.load(io.BytesIO(blob), weights_only=True)
        rounds.add(state["round"])
        tensors.update(state["model"])
        names = layout.stepped(old["stages"][p])
        optimizer = state["optimizer"]
        for index, value in optimizer.get("state", {}).items():
            per_param[names[int(index)]] = value
        if optimizer.get("param_groups"):
            groups = optimizer["param_groups"][0]
    (completed,) = rounds
    out = {}
    for p, stage_doc in enumerate(new["stages"]):
        names = layout.stepped(stage_doc)
        optimizer = {} if not names else {
            "state": {i: per_param[n] for i, n in enumerate(names) if n in per_param},
            "param_groups": [{**(groups or {}), "params": list(range(len(names)))}]}
        buf = io.BytesIO()
        torch.save({"round": completed, "stage": p, "layers": list(held_layers(stage_doc)),
                    "model": {k: tensors[k] for k in layout.held(stage_doc)}, "optimizer": optimizer}, buf)
        out[p] = buf.getvalue()
    return out


def stages_line(plan: dict) -> str:
    """`[0, 88) tx0 | [88, 142) nano0, nano2`, from a plan document."""
    return " | ".join(f"[{s['layers'][0]}, {s['layers'][1]}) {', '.join(s['devices'])}" for s in plan["stages"])


def _stages_text(plan: object) -> str:
    """`mobilenetv2: [0, 88) tx0 | …`, from a plan document (or whatever a checkpoint holds there)."""
    try:
        return f"{plan['model']}: {stages_line(plan)}"
    except (TypeError, KeyError):
        return repr(plan)[:200]


def plan_to_resume(meta: dict | None, plan):
    """The plan a run resumed with `plan` continues on, and the checkpoint's lineage: (plan, Lineage).

    A run whose fault tolerance re-planned it wrote its later rounds with the re-planned plan, and
    recorded the plan it was started with (`origin_plan`) and the devices lost since (`lost`).
    Resuming with the plan it was started with continues on the re-planned one, without the lost
    devices (`hppctl run --rejoin` brings them back instead). Anything else is left to `latest`,
    which re-cuts or refuses it."""
    from hppctl.models.plan import HppPlan
    from hppctl.runtime.lineage import Lineage, plan_digest, plan_document

    if meta is None or "origin_plan" not in meta:
        return plan, Lineage(origin=plan_digest(plan))
    lineage = Lineage(origin=meta["origin_plan"], lost=tuple(meta.get("lost", ())))
    if meta.get("plan") == plan_document(plan):
        return plan, lineage
    if meta["origin_plan"] == plan_digest(plan) and lineage.lost:
        return HppPlan.model_validate(meta["plan"]), lineage
    return plan, Lineage(origin=plan_digest(plan))
