"""The launcher's side of a collaborative inference run (`hppctl run` on an inference plan).

    result = run_inference(InferenceRequest(plan, cluster, ids, overlap=True, repeats=5))
    result.output            # [sequence, hidden] final hidden states
    result.summary()         # latency statistics and the per-device breakdown

It builds the model once (random weights from `seed`, or the `hf:` checkpoint's own), cuts every
device's shard (its heads and MLP columns; sp and local: everything), hosts the run's store, starts
one worker per device (a local subprocess, or over SSH for `host:` devices, as training runs do),
admits them by their join proofs and waits for their reports. A plan whose memory check failed
(a memory-blind baseline over a budget) is refused before anything starts: it would run out of memory.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from hppctl.errors import BadInput, Infeasible
from hppctl.models.cluster import ClusterSpec
from hppctl.models.inference import InferencePlan
from hppctl.models.units import format_bytes
from hppctl.planner.galaxy import split_rows
from hppctl.runtime import bootstrap, wire
from hppctl.runtime.galaxy.config import InferenceWorkerConfig
from hppctl.runtime.galaxy.weights import for_request
from hppctl.runtime.launcher import Launcher, from_blob, to_blob
from hppctl.runtime.progress import REPORT_EVERY_S, StepProgress, Throttle

WORKER_MODULE = "hppctl.runtime.galaxy.worker"


@dataclass
class InferenceRequest:
    plan: InferencePlan
    cluster: ClusterSpec
    ids: Any = None
    """Token ids, a 1-D int64 tensor; None: `seq_len` random ids from `seed` (default the plan's length).
    Heads and columns follow the plan at any length; rows are re-split equally for the ids' length."""
    seq_len: int | None = None
    overlap: bool = True
    """False (`--no-overlap`): every collective plain on galaxy's rings, whatever the plan chose (the
    ablation); True: the plan's own choice (block_overlap, collective)."""
    wire_dtype: str = "float32"
    """float32 (exact) or float16 on the wire."""
    repeats: int = 1
    warmup: int = 0
    threads: int = 0
    seed: int = 0
    timeout_s: float = 300.0
    listen: str | None = None
    log: Any = None
    env: dict = field(default_factory=dict)
    progress_every_s: float = REPORT_EVERY_S
    """How often workers report their passes, and the launcher reads them (runtime/progress.py)."""
    precision: str = "fp32"
    """fp32, fp16 or bf16: the forward's autocast on each device's accelerator (runtime/accelerator.py)."""


@dataclass
class InferenceResult:
    output: Any
    reports: dict[str, dict]
    """Per device: host, threads, memory, and one timing object per pass (device.PassTiming)."""
    wall_s: float
    plan: InferencePlan
    overlap: bool
    ring_bytes_per_s: float = 0.0
    """The slowest link between ring neighbours (from the inventory): prices the bytes each device sent."""
    wire_dtype: str = "float32"
    block_overlap: tuple[bool, ...] = (False,) * 4
    """What ran: overlap per ring collective of a layer, and galaxy's collective."""
    collective: str = "ring"

    def latencies(self) -> list[float]:
        """Per pass: the slowest device's latency (the request is done when every device is)."""
        passes = zip(*(r["passes"] for r in self.reports.values()))
        return [max(p["latency_s"] for p in per_device) for per_device in passes]

    def rows_run(self) -> list[int]:
        """Per device, the sequence rows its connective blocks ran: all of them on Megatron's forward,
        else its part of the request's length (the plan's rows are for the planned length, and a
        galaxy plan on the all-reduce collective run with `--no-overlap` runs the rings' split)."""
        length, devices = int(self.output.shape[0]), len(self.plan.shares)
        return [length] * devices if self.collective == "all-reduce" else split_rows(length, devices)

    def summary(self) -> dict[str, Any]:
        lat = self.latencies()
        devices = {}
        for d, r in self.reports.items():
            med = {k: statistics.median(p[k] for p in r["passes"])
                   for k in ("latency_s", "layers_s", "compute_s", "exposed_comm_s", "cpu_s")}
            sent = r["passes"][0]["bytes_sent"]
            devices[d] = {"host": r["host"], "threads": r["threads"], "peak_rss_bytes": r["peak_rss_bytes"],
                          "bytes_sent": sent, "communication_s": sent / self.ring_bytes_per_s if self.ring_bytes_per_s else 0.0,
                          **{f"median_{k}": v for k, v in med.items()}}
        return {"model": self.plan.model, "strategy": self.plan.strategy, "overlap": self.overlap,
                "block_overlap": list(self.block_overlap), "collective": self.collective,
                "wire_dtype": self.wire_dtype,
                "seq_len": int(self.output.shape[0]), "planned_seq_len": self.plan.seq_len, "layers": self.plan.num_layers, "repeats": len(lat),
                "latency_s": {"median": statistics.median(lat), "min": min(lat), "max": max(lat),
                              "mean": statistics.fmean(lat), "all": lat},
                "predicted_latency_s": self.plan.prediction.latency_s,
                "shares": [{"device": s.device, "heads": s.heads, "columns": s.columns, "rows": r}
                           for s, r in zip(self.plan.shares, self.rows_run())],
                "devices": devices, "wall_s": self.wall_s}


def refuse_over_budget(plan: InferencePlan) -> None:
    if plan.memory_violations:
        worst = ", ".join(f"{v.device} needs {format_bytes(v.needed_bytes)} of {format_bytes(v.budget_bytes)}"
                          for v in plan.memory_violations)
        raise Infeasible(f"{plan.strategy} plan exceeds memory budgets (OOM): {worst}")


def shards(plan: InferencePlan, seed: int) -> dict[str, dict]:
    """Every device's weights, cut from one model built here."""
    from hppctl.runtime.galaxy.weights import build_base_model, device_shard, extract
    from hppctl.schedule.routing import owned_ranges

    base, family = build_base_model(plan.model, plan.num_layers, seed=seed)
    weights = extract(base, family, plan.num_layers)
    meta = weights["meta"]
    if (meta["hidden"], meta["heads"]) != (plan.hidden, plan.heads):
        raise BadInput(f"plan: {plan.model} has hidden {meta['hidden']} and {meta['heads']} heads, "
                       f"the plan was made for {plan.hidden} and {plan.heads}")
    del base
    if plan.strategy in ("sp", "local"):
        whole = device_shard(weights, (0, plan.heads), (0, plan.intermediate))
        return {s.device: whole for s in plan.shares}
    heads, columns = owned_ranges([s.heads for s in plan.shares]), owned_ranges([s.columns for s in plan.shares])
    return {s.device: device_shard(weights, heads[i], columns[i]) for i, s in enumerate(plan.shares)}


def token_ids(req: InferenceRequest, vocab: int):
    """The request's ids, checked against the vocabulary, or seeded random ones."""
    import torch

    if req.ids is None:
        n = req.seq_len or req.plan.seq_len
        return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(req.seed))
    ids = torch.as_tensor(req.ids, dtype=torch.long).reshape(-1)
    if ids.numel() == 0:
        raise BadInput("input: no tokens")
    if ids.min() < 0 or ids.max() >= vocab:
        raise BadInput(f"input: token ids must lie in [0, {vocab}) for {req.plan.model} "
                       f"(got {int(ids.min())}..{int(ids.max())})")
    return ids


class InferenceSession(Launcher):
    """The launcher with an inference plan: ships every device's shard and the ids, waits for the
    passes, collects the timings and rank 0's output. A worker's reported error fails the run at
    once (it waits on its ring neighbours otherwise); one over its memory budget is `Infeasible`.
    Phases: "model" (build and cut the weights), "workers" (start and join), "passes"."""

    worker_module = WORKER_MODULE
    worker_noun = "inference worker"
    running_phase = "passes"
    fail_on_report = True

    def _devices(self) -> list[str]:
        return [s.device for s in self.request.plan.shares]

    def run(self) -> InferenceResult:
        req, plan = self.request, self.request.plan
        refuse_over_budget(plan)
        self._check_devices()
        self._prepare()
        started = time.perf_counter()
        self.on_phase("model")
        parts = shards(plan, req.seed)
        ids = token_ids(req, next(iter(parts.values()))["embed"]["word"].shape[0])
        trimmed = {d: for_request(shard, ids) for d, shard in parts.items()}
        parts, local_ids = {d: t[0] for d, t in trimmed.items()}, next(iter(trimmed.values()))[1]
        self.on_phase("workers")

        def ship(store) -> None:
            for device, shard in parts.items():
                bootstrap.put_blob(store, wire.shard(device), to_blob(shard))
            parts.clear()
            bootstrap.put_blob(store, wire.ids(), to_blob(local_ids))

        reports, output = self._run_workers(req.timeout_s, ship=ship, config_of=self._config(len(ids)),
                                            collect=self._wait_reports)
        return InferenceResult(output, reports, time.perf_counter() - started, plan, any(block_overlap(req)),
                               self._ring_rate(), req.wire_dtype, block_overlap(req), collective(req))

    def _ring_rate(self) -> float:
        names = self.request.plan.devices()
        if len(names) < 2:
            return 0.0
        return min(self.request.cluster.bandwidth_between(a, b) for a, b in zip(names, names[1:] + names[:1]))

    def _check_devices(self) -> None:
        for share in self.request.plan.shares:
            try:
                spec = self.request.cluster.device(share.device)
            except KeyError:
                raise BadInput(f"--cluster: the plan's device {share.device!r} is not in the inventory") from None
            if spec.preset is not None:
                raise BadInput(f"--cluster: device {share.device!r} is a preset (a model of a device): "
                               f"runs need local: or host: devices")

    def _config(self, length: int) -> Callable[[str], InferenceWorkerConfig]:
        return lambda device: worker_config(self.request, device, length, self.store.host, self.store.port)

    def _wait_reports(self) -> tuple[dict[str, dict], object]:
        """Every device's timings and rank 0's output, once every device is done."""
        steps = Throttle(self.request.progress_every_s)
        while not self._all_done():
            self._check_alive()
            self._show_progress(steps, 0)
            time.sleep(0.02)
        store = self.store.store
        return ({d: bootstrap.read_json(store, wire.timings(d)) for d in self._devices()},
                from_blob(bootstrap.get_blob(store, wire.output(), delete=True)))


def block_overlap(req: InferenceRequest) -> tuple[bool, bool, bool, bool]:
    """What runs overlapped, per ring collective of a layer: the galaxy plan's choice, nothing with
    `--no-overlap` or for another strategy."""
    if not req.overlap or req.plan.strategy != "galaxy":
        return (False,) * 4
    return req.plan.overlap_by_block()


def collective(req: InferenceRequest) -> str:
    """The plan's collective; `--no-overlap` runs galaxy's plain rings (the ablation of the paper's
    design); megatron's is always gloo's AllReduce (reported so)."""
    if req.plan.strategy == "megatron":
        return "all-reduce"
    return req.plan.collective if req.overlap else "ring"


def worker_config(req: InferenceRequest, device: str, length: int, store_host: str,
                  store_port: int) -> InferenceWorkerConfig:
    """What `device`'s worker is told for a request of `length` tokens: with its shard (`shards`), all
    that decides the program it runs (hmp.forward) and where. PURE."""
    plan = req.plan
    rank = plan.devices().index(device)
    flags = block_overlap(req)
    return InferenceWorkerConfig(
        device=device, rank=rank, world_size=len(plan.shares), store_host=store_host, store_port=store_port,
        strategy=plan.strategy, row_sizes=split_rows(length, len(plan.shares)),  # megatron's forward ignores rows
        overlap=any(flags), block_overlap=list(flags), collective=collective(req),
        repeats=req.repeats, warmup=req.warmup, threads=req.threads,
        budget_bytes=plan.shares[rank].memory_budget_bytes, wire_dtype=req.wire_dtype, timeout_s=req.timeout_s,
        progress_every_s=req.progress_every_s, precision=req.precision,
        accelerator=req.cluster.device(device).accelerator)


def run_inference(request: InferenceRequest, *, on_phase: Callable[[str], None] | None = None,
                  on_step: Callable[[StepProgress], None] | None = None, user_code=None) -> InferenceResult:
    """Run the request; on_phase and on_step: `InferenceSession`'s progress hooks; user_code: the
    run's `--workdir` (runtime/workdir.py; `Launcher.user_code`)."""
    session = InferenceSession(request)
    session.user_code = user_code
    if on_phase is not None:
        session.on_phase = on_phase
    session.on_step = on_step
    return session.run()
