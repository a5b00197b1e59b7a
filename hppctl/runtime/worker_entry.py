"""The life of every worker process (training, fault-tolerant training, PSL, inference), owned once.

`worker_main` reads the {token, config} line on stdin; `run_worker_process` sets torch's threads,
connects to the launcher's store, writes `pid/<device>`, puts the run's `--workdir` first on the
import path and imports its user modules (`config.user_code`, runtime/workdir.py: one that fails is
`failed/<device>` as bad input, exit 2, before the join), joins, runs the kind's `body(ctx)`, then
writes `done/<device>` (exit 0). An exception prints its traceback and becomes `failed/<device>`
(exit 1). A body that returns an exit code instead of None ends without `done/` (a fault-tolerant
worker dismissed by a re-plan, or orphaned by its coordinator).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable

from hppctl.allocator import steady_heap
from hppctl.runtime import wire
from hppctl.runtime.workdir import BAD_INPUT_PREFIX
from hppctl.runtime.workdir import prepare as prepare_user_code
from hppctl.shutdown import exit_process


@dataclass(frozen=True)
class WorkerContext:
    """What a body works with: its config, the run's token, and the store it joined through."""

    config: object
    token: str
    store: object


def run_worker_process(config, token: str, body: Callable[[WorkerContext], "int | None"], *,
                       before_join: Callable[[WorkerContext], None] | None = None) -> int:
    """Connect, say the pid, import the user's code, join, run `body`, report; returns the exit code.
    `config` is any worker config (device, store_host, store_port, threads, timeout_s, user_code).
    `before_join` runs between the pid and the join (a fault-tolerant worker starts its heartbeats there)."""
    import torch

    from hppctl.runtime import bootstrap

    if config.threads:
        torch.set_num_threads(config.threads)
    from hppctl.zoo.user import declare_input
    declare_input(getattr(config, "model", ""), getattr(config, "model_input", None))  # a user model's input spec
    store = bootstrap.connect_store(config.store_host, config.store_port, token, timeout_s=config.timeout_s)
    store.set(wire.pid(config.device), f"{socket.gethostname()} {os.getpid()}")
    problem = prepare_user_code(config.user_code, config.device)
    if problem is not None:  # before the join: no worker of the run trains (the launcher exits 2)
        print(f"error: {problem}", file=sys.stderr)
        store.set(wire.failed(config.device), BAD_INPUT_PREFIX + problem)
        return 2
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
        traceback.print_exc()
        try:
            store.set(wire.failed(config.device), f"{e.__class__.__name__}: {e}"[:2000])
        except Exception:  # the store may be gone with the launcher; the exit code still says it
            pass
        return 1


def worker_main(config_type, run: Callable[[object, str], int]) -> None:
    """A worker module's entry point: one JSON line {token, config} on stdin, then `run(config, token)`."""
    steady_heap()  # as the profile was measured (hppctl/allocator.py)
    try:
        doc = json.loads(sys.stdin.readline())
        token = doc["token"]
        config = config_type.model_validate_json(json.dumps(doc["config"]))
    except (ValueError, KeyError) as e:
        print(f"error: worker needs one JSON line {{token, config}} on stdin ({e})", file=sys.stderr)
        sys.exit(2)
    exit_process(run(config, token))  # without the collector's shutdown passes: hppctl/shutdown.py


def load_blob(store, key: str):
    """A torch blob the launcher put in the store (tensors only)."""
    from hppctl.runtime.bootstrap import get_blob
    from hppctl.runtime.replication import from_bytes

    return from_bytes(get_blob(store, key))


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


def process_report() -> dict:
    """The process's memory (now, peak) and where it runs, as every round or timing report carries them."""
    return {"rss_bytes": rss_bytes(), "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "host": socket.gethostname()}
