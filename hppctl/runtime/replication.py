"""Stage state by tensor name: snapshots, topology-driven backups, layer migration (paper §3.4).

A *stage state* is `{"tensors": {name: tensor}, "optim": {parameter name: {key: tensor}}}`:
parameters and every buffer (non-persistent ones too, as `stage.stage_tensors` gives them) under the
model's own names, and the optimizer state of each parameter under the parameter's name. Keyed by
name, the state of any layer range can be cut out of it and merged into another stage, whatever
the stage boundaries were — which is what a migration between re-planned stages needs.

- `Snapshots`: every worker keeps its own stage state after every K-th round (the newest `KEEP`),
  so the whole pipeline can roll back to a round every stage has.
- Backups: a single-device stage sends its state to its backup holder (planner.replan.backup_targets:
  the first device of the next stage, the last stage to the first) after the same rounds, over the
  run's gloo group, on the same links as the pipeline's own traffic.
- `send_bytes` / `recv_bytes`: a byte string over point-to-point gloo (its length first);
  `Backups.receive_later` receives a backup's bytes in the background.
"""

from __future__ import annotations

import functools
import io
import threading

import torch

KEEP = 3
"""Snapshots (and backups) kept: stages finish a round at different times (the head last under
1F1B), so a consistent round may be up to two behind the newest one of some device."""

LENGTH_TAG, BYTES_TAG = 1 << 20, (1 << 20) + 1
"""Tags of state transfers; far above the executor's (micro-batch, channel, tensor) tags."""


def stage_state(stage, optimizer) -> dict:
    from hppctl.runtime.stage import stage_tensors

    params = dict(stage.module.named_parameters())
    state = getattr(optimizer, "state", {})
    optim = {name: {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in state[p].items()}
             for name, p in params.items() if p in state}
    return {"tensors": stage_tensors(stage.module), "optim": optim}


def restore_optimizer(optimizer, stage, optim: dict) -> None:
    """Put per-name optimizer state back onto the new stage's parameters (same hyper-parameters)."""
    if not hasattr(optimizer, "state"):
        return
    for name, p in stage.module.named_parameters():
        if name in optim:
            optimizer.state[p] = {k: _state_on(p, k, v) for k, v in optim[name].items()}


def _state_on(param, key: str, value):
    """A copy of one optimizer state entry next to its parameter (a backup arrives in host memory
    while the stage may compute on a GPU); `step` stays where torch keeps it, as load_state_dict does."""
    if not torch.is_tensor(value):
        return value
    if key == "step" or value.device == param.device:
        return value.clone()
    return value.to(param.device, copy=True)


def subset(state: dict, names: set[str]) -> dict:
    return {"tensors": {k: v for k, v in state["tensors"].items() if k in names},
            "optim": {k: v for k, v in state["optim"].items() if k in names}}


def merge(parts: list[dict]) -> dict:
    out = {"tensors": {}, "optim": {}}
    for part in parts:
        out["tensors"].update(part["tensors"])
        out["optim"].update(part["optim"])
    return out


def state_bytes(state: dict) -> dict[str, int]:
    """Per name, the bytes of its tensors in a stage state: the parameter or buffer itself plus the
    parameter's optimizer state. What moving that name to another device carries (the serialization's
    own framing aside), so a re-plan can report the bytes it moves (docs/fault-tolerance.md)."""
    sizes = {name: _nbytes(t) for name, t in state["tensors"].items()}
    for name, entry in state["optim"].items():
        sizes[name] = sizes.get(name, 0) + sum(_nbytes(v) for v in entry.values() if torch.is_tensor(v))
    return sizes


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


def to_bytes(state: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def from_bytes(data: bytes) -> dict:
    """Tensors land in host memory whatever device they were saved from (a worker's accelerator may
    not exist where they are read: the launcher, another device)."""
    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


@functools.lru_cache(maxsize=4)
def meta_model(model: str):
    """The whole model on the meta device (no memory), built once: a re-plan cuts several ranges of it
    and building takes a second on a slow device."""
    from hppctl.zoo import get_model

    return get_model(model).build(device="meta").train()


@functools.lru_cache(maxsize=64)
def layer_names(model: str, granularity: str, start: int, end: int) -> frozenset[str]:
    """Names of the parameters and buffers of layers [start, end) (cut from a meta model: no memory)."""
    from hppctl.zoo import build_stage

    module = build_stage(meta_model(model), granularity, start, end, mode="train")
    return frozenset([k for k, _ in module.named_parameters()] + [k for k, _ in module.named_buffers()])


class Snapshots:
    """Round (rounds completed) → state, the newest `KEEP`."""

    def __init__(self) -> None:
        self.states: dict[int, dict] = {}

    def add(self, rounds: int, state: dict) -> None:
        self.states[rounds] = state
        for old in sorted(self.states)[:-KEEP]:
            del self.states[old]

    def rounds(self) -> list[int]:
        return sorted(self.states)


class Backups:
    """Device → {round: serialized state} held for other devices' single-device stages.

    A backup's bytes arrive while the holder trains on (`receive_later`): only complete ones are held,
    so the inventory a re-plan sees never names a backup that is still on the wire."""

    def __init__(self) -> None:
        self.held: dict[str, dict[int, bytes]] = {}
        self._lock = threading.Lock()
        self._arriving: list[threading.Thread] = []

    def add(self, device: str, rounds: int, data: bytes) -> None:
        with self._lock:
            per = self.held.setdefault(device, {})
            per[rounds] = data
            for old in sorted(per)[:-KEEP]:
                del per[old]

    def inventory(self) -> dict[str, list[int]]:
        with self._lock:
            return {d: sorted(per) for d, per in self.held.items()}

    def get(self, device: str, rounds: int) -> bytes:
        with self._lock:
            return self.held[device][rounds]

    def state_bytes(self) -> dict[str, dict[str, dict[str, int]]]:
        """Device -> round -> `state_bytes` of the backup held (deserialized here: a re-plan needs it,
        rounds do not)."""
        with self._lock:
            held = {d: dict(per) for d, per in self.held.items()}
        return {d: {str(r): state_bytes(from_bytes(data)) for r, data in per.items()} for d, per in held.items()}

    def receive_later(self, comm, device: str, rounds: int) -> None:
        """Take the backup's length now (its sender has reached the same round) and let the bytes arrive
        on a daemon thread, so that the holder's next round overlaps the transfer instead of waiting
        for it. A transfer that fails (its sender died) is simply not held."""
        work, payload = post_recv_bytes(comm, device)
        raw = getattr(work, "work", work)  # the gloo work itself: this thread must not give up on an abort

        def arrive() -> None:
            try:
                raw.wait()
            except Exception:
                return
            self.add(device, rounds, payload.numpy().tobytes())

        thread = threading.Thread(target=arrive, daemon=True, name=f"backup-from-{device}")
        thread.start()
        self._arriving = [t for t in self._arriving if t.is_alive()] + [thread]

    def settle(self, abort: threading.Event) -> bool:
        """Wait until every backup on the wire has arrived (True), or until `abort` is set (False)."""
        for thread in self._arriving:
            while thread.is_alive():
                if abort.is_set():
                    return False
                thread.join(0.05)
        self._arriving = []
        return True


def send_bytes(comm, data: bytes, peer: str) -> list:
    """Post the length and the bytes; the caller waits for the returned works (and keeps the tensors)."""
    length = torch.tensor([len(data)], dtype=torch.int64)
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return [(comm.isend(length, peer, LENGTH_TAG), length), (comm.isend(payload, peer, BYTES_TAG), payload)]


def post_recv_bytes(comm, peer: str):
    """Wait for the length, post the receive of the bytes: (its work, the tensor they land in)."""
    length = torch.zeros(1, dtype=torch.int64)
    comm.irecv(length, peer, LENGTH_TAG).wait()
    payload = torch.empty(int(length.item()), dtype=torch.uint8)
    return comm.irecv(payload, peer, BYTES_TAG), payload


def recv_bytes(comm, peer: str) -> bytes:
    work, payload = post_recv_bytes(comm, peer)
    work.wait()
    return payload.numpy().tobytes()
