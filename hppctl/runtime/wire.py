"""The launcher–worker wire: every store key of a run, one function per key family, and the helpers
that read and write its records.

Every cross-process arrow of a run goes through the run's `TCPStore` (under the run's prefix,
`bootstrap.key_prefix`): who writes a key, who reads it, and what it holds is listed here and
nowhere else, so a new schedule or a new reader cannot invent a key the others do not know.
Keys are plain strings (the store's), built only by these functions; payloads are JSON documents
(read bounded with `bootstrap.read_json`), short text, or torch blobs (`bootstrap.put_blob`).
This module imports nothing of hppctl: every runtime module may import it.

Pairing contract (W: writer, R: reader; L launcher, w worker):

| family | payload | W | R |
|---|---|---|---|
| `nonce()` | hex nonce | L | w (join proof) |
| `join(device)` | HMAC proof | w | L |
| `start()` | "1" once every device joined | L | w |
| `pid(device)` | "host pid" | w | L (to signal SSH workers) |
| `done(device)` / `failed(device)` | time / "Error: message" | w | L |
| `progress(device)` | JSON step progress, overwritten | w | L |
| `init(stage)` / `init_part(start, end)` / `resume(stage)` | torch blob (a PSL run's `resume(rank)`: a device's state) | L | w |
| `metrics(round, device)` | JSON round report, deleted once read | w | L |
| `ckpt(round, stage)` / `final(owner)` | torch blob of stage state (PSL: `ckpt(round, rank)`, `final(device)`: parts and optimizers) | w | L |
| `ready(device)` / `finished(generation, device)` / `end()` | "1" (fault tolerance) | w / w / L | L / L / w |
| `stall(generation, device)` | JSON inventory (fault tolerance) | w | L |
| `gather(generation)` / `reconf(generation)` | JSON documents (fault tolerance) | L | w |
| `heavy_old(generation, stage)` / `heavy_new(generation, stage)` | torch blob | w / L | L / w |
| `arrived(generation, device)` / `moved(generation, device)` | "1" between workers | w | w |
| `batch_ready(step, device)` | "1" between PSL workers, deleted by its writer two steps on | w | w |
| `reduce_arrived(round, device)` | "1" between the replicas of a stage of 3+, deleted by its writer two rounds on | w | w |
| `shard(device)` / `ids()` / `output()` / `timings(device)` | inference blobs / JSON | L, L, w, w | w, w, L, L |
"""

from __future__ import annotations

from collections.abc import Sequence

# gloo's rendezvous keys for the run's process groups live under this prefix (torch's own keys).
PG_PREFIX = "pg/"


# --- lifecycle: every run kind -----------------------------------------------------------------

def nonce() -> str:
    return "nonce"


def join(device: str) -> str:
    return f"join/{device}"


def start() -> str:
    return "start"


def pid(device: str) -> str:
    return f"pid/{device}"


def done(device: str) -> str:
    return f"done/{device}"


def failed(device: str) -> str:
    return f"failed/{device}"


def progress(device: str) -> str:
    return f"progress/{device}"


# --- training --------------------------------------------------------------------------------------

def init(stage: int) -> str:
    return f"init/{stage}"


def init_part(start_layer: int, end_layer: int) -> str:
    """A PSL part's initial weights: layers [start_layer, end_layer)."""
    return f"init/{start_layer}-{end_layer}"


def resume(stage: int) -> str:
    return f"resume/{stage}"


def metrics(round_index: int, device: str) -> str:
    return f"metrics/{round_index}/{device}"


def ckpt(round_index: int, stage: int) -> str:
    return f"ckpt/{round_index}/{stage}"


def final(owner: int | str) -> str:
    """A stage's final state (HPP: the stage index) or a PSL device's parts (its name)."""
    return f"final/{owner}"


# --- fault tolerance ------------------------------------------------------------------------------

def ready(device: str) -> str:
    return f"ready/{device}"


def finished(generation: int, device: str) -> str:
    return f"finished/{generation}/{device}"


def end() -> str:
    return "end"


def stall(generation: int, device: str) -> str:
    return f"stall/{generation}/{device}"


def gather(generation: int) -> str:
    return f"gather/{generation}"


def reconf(generation: int) -> str:
    return f"reconf/{generation}"


def heavy_old(generation: int, stage: int) -> str:
    return f"heavy/{generation}/old/{stage}"


def heavy_new(generation: int, stage: int) -> str:
    return f"heavy/{generation}/new/{stage}"


def generation_prefix(generation: int) -> str:
    """The prefix of a re-planned generation's own keys (its gloo groups, its worker barriers)."""
    return f"gen{generation}/"


def arrived(generation: int, device: str) -> str:
    return f"{generation_prefix(generation)}arrived/{device}"


def moved(generation: int, device: str) -> str:
    return f"{generation_prefix(generation)}moved/{device}"


def reduce_arrived(round_index: int, device: str) -> str:
    """A replica reached round `round_index`'s AllReduce (worker.py: `StoreArrivals`)."""
    return f"reduce/{round_index}/{device}"


# --- parallel split learning --------------------------------------------------------------------------

def batch_ready(step: int, device: str) -> str:
    """A PSL device reached the barrier before batch `step` (psl/worker.py: `BatchBarrier`)."""
    return f"batch/{step}/{device}"


# --- inference ----------------------------------------------------------------------------------------

def shard(device: str) -> str:
    return f"shard/{device}"


def ids() -> str:
    return "ids"


def output() -> str:
    return "output"


def timings(device: str) -> str:
    return f"timings/{device}"


# --- blobs ------------------------------------------------------------------------------------------
# A blob (torch state, shards) larger than one store value travels as numbered chunks under its key.

def blob_chunk(key: str, index: int) -> str:
    return f"{key}/{index}"


def blob_count(key: str) -> str:
    """How many chunks the blob under `key` has; written last, so its presence means complete."""
    return f"{key}/n"


# --- helpers -------------------------------------------------------------------------------------------

def metrics_keys(round_index: int, devices: Sequence[str]) -> list[str]:
    return [metrics(round_index, d) for d in devices]


def done_keys(devices: Sequence[str]) -> list[str]:
    return [done(d) for d in devices]
