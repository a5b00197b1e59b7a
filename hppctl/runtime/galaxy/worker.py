"""An inference worker: one device of a collaborative inference run. Started by `hppctl run`, never by hand.

    python -m hppctl.runtime.galaxy.worker      # reads one JSON line on stdin: {"token": …, "config": InferenceWorkerConfig}

It connects to the launcher's store, joins with the token, takes its weight shard and the token ids
from the store (it never builds the model, so it never imports `transformers`), joins the gloo group
(rank = its index in the plan), runs the passes, and reports: `timings/<device>` (one object per
timed pass), the whole output from rank 0 (`output`), then `done/<device>`. Any exception becomes
`failed/<device>` with the traceback on stderr, and exit code 1.
"""

from __future__ import annotations

import io
import json
import os
import socket
import time
import traceback

from hppctl.runtime.galaxy.config import InferenceWorkerConfig
from hppctl.runtime.worker import worker_main


def load_blob(store, key: str):
    import torch

    from hppctl.runtime.bootstrap import get_blob

    return torch.load(io.BytesIO(get_blob(store, key)), weights_only=True)


def check_budget(config: InferenceWorkerConfig, shard) -> None:
    """Refuse a shard whose layer weights do not fit the device's budget (the planner's Eq. 5 check,
    repeated where the memory is, so a hand-edited plan cannot run a device out of memory)."""
    from hppctl.errors import Infeasible
    from hppctl.models.units import format_bytes
    from hppctl.runtime.galaxy.weights import shard_bytes

    need = shard_bytes(shard)
    if config.budget_bytes is not None and need >= config.budget_bytes:
        raise Infeasible(f"device {config.device}: its layer weights need {format_bytes(need)}, "
                         f"its budget is {format_bytes(config.budget_bytes)} (OOM)")


def serve(config: InferenceWorkerConfig, store) -> None:
    import torch

    from hppctl.runtime import bootstrap
    from hppctl.runtime.galaxy.device import run_device
    from hppctl.runtime.progress import StepReporter
    from hppctl.runtime.worker import peak_rss_bytes, rss_bytes

    if config.threads:
        torch.set_num_threads(config.threads)
    shard = load_blob(store, f"shard/{config.device}")
    check_budget(config, shard)
    ids = load_blob(store, "ids")
    bootstrap.init_process_groups(store, config.rank, config.world_size, [], 0, store_host=config.store_host,
                                  timeout_s=config.timeout_s)
    reporter = StepReporter(store, config.device, "passes", config.progress_every_s)
    try:
        output, timings = run_device(config.strategy, shard, ids, config.rank, config.row_sizes,
                                     overlap=config.overlap, repeats=config.repeats, warmup=config.warmup,
                                     wire_dtype=config.wire_dtype,
                                     on_pass=lambda done, total: reporter.report(0, done, total))
    finally:
        bootstrap.destroy_process_groups()
    report = {"device": config.device, "host": socket.gethostname(), "threads": torch.get_num_threads(),
              "rss_bytes": rss_bytes(), "peak_rss_bytes": peak_rss_bytes(),
              "passes": [t.as_json() for t in timings]}
    store.set(f"timings/{config.device}", json.dumps(report))
    if config.rank == 0:
        buf = io.BytesIO()
        torch.save(output.contiguous(), buf)
        bootstrap.put_blob(store, "output", buf.getvalue())


def run_worker(config: InferenceWorkerConfig, token: str) -> int:
    from hppctl.runtime import bootstrap

    store = bootstrap.connect_store(config.store_host, config.store_port, token, timeout_s=config.timeout_s)
    store.set(f"pid/{config.device}", f"{socket.gethostname()} {os.getpid()}")
    try:
        bootstrap.join(store, token, config.device, timeout_s=config.timeout_s)
        serve(config, store)
        store.set(f"done/{config.device}", str(time.time()))
        return 0
    except BaseException as e:
        traceback.print_exc()
        try:
            store.set(f"failed/{config.device}", f"{e.__class__.__name__}: {e}"[:2000])
        except Exception:  # the store may be gone with the launcher; the exit code still says it
            pass
        return 1


def main() -> None:
    worker_main(InferenceWorkerConfig, run_worker)


if __name__ == "__main__":
    main()
