"""An inference worker: one device of a collaborative inference run. Started by `hppctl run`, never by hand.

    python -m hppctl.runtime.galaxy.worker      # reads one JSON line on stdin: {"token": …, "config": InferenceWorkerConfig}

It connects to the launcher's store, joins with the token, takes its weight shard and the token ids
from the store (it never builds the model, so it never imports `transformers`), joins the gloo group
(rank = its index in the plan), runs the passes, and reports: `timings/<device>` (one object per
timed pass), the whole output from rank 0 (`output`), then `done/<device>`. Any exception becomes
`failed/<device>` with the traceback on stderr, and exit code 1.
"""

from __future__ import annotations

import json
from functools import partial

from hppctl.runtime import wire
from hppctl.runtime.galaxy.config import InferenceWorkerConfig
from hppctl.runtime.worker_entry import WorkerContext, load_blob, process_report, run_worker_process, worker_main


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


def serve(ctx: WorkerContext) -> None:
    """The body of an inference worker: its shard and the ids, the ring, the passes, the timings."""
    import torch

    from hppctl.runtime import bootstrap
    from hppctl.runtime.accelerator import precision_for, resolve, to_wire
    from hppctl.runtime.galaxy.device import run_device
    from hppctl.runtime.progress import StepReporter
    from hppctl.runtime.replication import to_bytes

    config, store = ctx.config, ctx.store
    device = resolve(config.accelerator, device_name=config.device)  # here, on the device
    precision = precision_for(config.precision, device)
    shard = load_blob(store, wire.shard(config.device))
    check_budget(config, shard)
    ids = load_blob(store, wire.ids())
    bootstrap.init_process_groups(store, config.rank, config.world_size, [], 0, store_host=config.store_host,
                                  timeout_s=config.timeout_s)
    reporter = StepReporter(store, config.device, "passes", config.progress_every_s)
    output, timings = run_device(config.strategy, shard, ids, config.rank, config.row_sizes,
                                 overlap=config.block_overlap if config.block_overlap is not None else config.overlap,
                                 collective=config.collective, repeats=config.repeats, warmup=config.warmup,
                                 wire_dtype=config.wire_dtype, device=device, precision=precision,
                                 on_pass=lambda done, total: reporter.report(0, done, total))
    bootstrap.destroy_process_groups()  # before the reports: the launcher may end the run once it has them
    report = {"device": config.device, **process_report(), "threads": torch.get_num_threads(),
              "passes": [t.as_json() for t in timings]}
    store.set(wire.timings(config.device), json.dumps(report))
    if config.rank == 0:
        bootstrap.put_blob(store, wire.output(), to_bytes(to_wire(output.contiguous())))


if __name__ == "__main__":
    worker_main(InferenceWorkerConfig, partial(run_worker_process, body=serve))
