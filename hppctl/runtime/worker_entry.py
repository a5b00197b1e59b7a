"""The life of every worker process, whatever it runs (training, fault-tolerant training, PSL, inference).

    worker_main(ConfigType, run)       # `python -m <worker module>`: one JSON line {token, config} on stdin

`run_worker_process` owns what every kind does the same way: torch's thread count, the connection
to the launcher's store, `pid/<device>` (so the launcher can signal an SSH worker), the join with
the run's token, then the kind's `body(ctx)`, then `done/<device>` and exit code 0. Any exception is
printed (traceback on stderr), reported as `failed/<device>`, and the exit code is 1. A body that
ends the worker in another way (a fault-tolerant worker dismissed by a re-plan, or orphaned by its
coordinator) returns its exit code instead of None: no `done/` is written then.
"""

from __future__ import annotations

import io
import json
import os
import resource
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Protocol

from hppctl.allocator import steady_heap
from hppctl.runtime import wire


class EntryConfig(Protocol):
    """What the entry reads of a worker's config (WorkerConfig, PslWorkerConfig, InferenceWorkerConfig)."""

    device: str
    store_host: str
    store_port: int

    @property
    def threads(self) -> int | None: ...

    @property
    def timeout_s(self) -> float: ...


@dataclass(frozen=True)
class WorkerContext:
    """What a body works with: its config, the run's token, and the store it joined through."""

    config: EntryConfig
    token: str
    store: object

    @property
    def device(self) -> str:
        return self.config.device


Body = Callable[[WorkerContext], "int | None"]


def run_worker_process(config: EntryConfig, token: str, body: Body, *,
                       before_join: Callable[[WorkerContext], None] | None = None) -> int:
    """Connect, say the pid, join, run `body`, report; returns the exit code. `before_join` runs
    between the pid and the join (a fault-tolerant worker starts its heartbeats there)."""
    import torch

    from hppctl.runtime import bootstrap

    if config.threads:
        torch.set_num_threads(config.threads)
    store = bootstrap.connect_store(config.store_host, config.store_port, token, timeout_s=config.timeout_s)
    store.set(wire.pid(config.device), f"{socket.gethostname()} {os.getpid()}")
    ctx = WorkerContext(config, token, store)
    try:
        if before_join is not None:
            before_join(ctx)
        bootstrap.join(store, token, config.device, timeout_s=config.timeout_s)
        try:
            code = body(ctx)
        finally:
            bootstrap.destroy_process_groups()
        if code is not None:
            return code
        store.set(wire.done(config.device), str(time.time()))
        return 0
    except BaseException as e:
        return report_failure(store, config.device, e)


def report_failure(store, device: str, error: BaseException) -> int:
    """Print the traceback, tell the launcher through its store; the worker's exit code (1)."""
    traceback.print_exc()
    try:
        store.set(wire.failed(device), f"{error.__class__.__name__}: {error}"[:2000])
    except Exception:  # the store may be gone with the launcher; the exit code still says it
        pass
    return 1


def worker_main(config_type, run: Callable[[object, str], int]) -> None:
    """A worker module's entry point: one JSON line {token, config} on stdin, then `run(config, token)`."""
    steady_heap()  # as the profile was measured (hppctl/allocator.py)
    line = sys.stdin.readline()
    try:
        doc = json.loads(line)
        token = doc["token"]
        config = config_type.model_validate_json(json.dumps(doc["config"]))
    except (ValueError, KeyError) as e:
        print(f"error: worker needs one JSON line {{token, config}} on stdin ({e})", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(config, token))


def load_blob(store, key: str):
    """A torch blob the launcher put in the store (tensors only)."""
    import torch

    from hppctl.runtime.bootstrap import get_blob

    return torch.load(io.BytesIO(get_blob(store, key)), weights_only=True)


# --- what a worker reports of its process -------------------------------------------------------------

def rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_cgroup() -> str:
    """The cgroup whose CPU controller holds this process (v1 `cpu`, else the v2 unified path)."""
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return ""
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), "")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def process_report() -> dict:
    """The process's memory and where it runs, as every round or timing report carries them."""
    return {"rss_bytes": rss_bytes(), "peak_rss_bytes": peak_rss_bytes(), "host": socket.gethostname()}
