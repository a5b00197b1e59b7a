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

import io
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from hppctl.errors import BadInput, Infeasible, RuntimeFailure
from hppctl.models.cluster import ClusterSpec
from hppctl.models.inference import InferencePlan
from hppctl.models.units import format_bytes
from hppctl.planner.galaxy import split_rows
from hppctl.runtime import bootstrap
from hppctl.runtime.galaxy.config import InferenceWorkerConfig
from hppctl.runtime.galaxy.weights import for_request
from hppctl.runtime.launch import LocalWorker, SshWorker, prepare_local_workers, stop_workers
from hppctl.runtime.progress import REPORT_EVERY_S, StepProgress, Throttle, read_steps, slowest

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


@dataclass
class InferenceResult:
    output: Any
    reports: dict[str, dict]
    """Per device: host, threads, memory, and one timing object per pass (device.PassTiming)."""
    wall_s: float
    plan: InferencePlan
    overlap: bool
    ring_bytes_per_s: float = 0.0
    wire_dtype: str = "float32"
    """The slowest link between ring neighbours (from the inventory): prices the bytes each device sent."""

    def latencies(self) -> list[float]:
        """Per pass: the slowest device's latency (the request is done when every device is)."""
        passes = zip(*(r["passes"] for r in self.reports.values()))
        return [max(p["latency_s"] for p in per_device) for per_device in passes]

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
                "wire_dtype": self.wire_dtype,
                "seq_len": int(self.output.shape[0]), "planned_seq_len": self.plan.seq_len, "layers": self.plan.num_layers, "repeats": len(lat),
                "latency_s": {"median": statistics.median(lat), "min": min(lat), "max": max(lat),
                              "mean": statistics.fmean(lat), "all": lat},
                "predicted_latency_s": self.plan.prediction.latency_s,
                "shares": [{"device": s.device, "heads": s.heads, "columns": s.columns, "rows": s.rows}
                           for s in self.plan.shares],
                "devices": devices, "wall_s": self.wall_s}


def refuse_over_budget(plan: InferencePlan) -> None:
    if plan.memory_violations:
        worst = ", ".join(f"{v.device} needs {format_bytes(v.needed_bytes)} of {format_bytes(v.budget_bytes)}"
                          for v in plan.memory_violations)
        raise Infeasible(f"{plan.strategy} plan exceeds memory budgets (OOM): {worst}")


def shards(plan: InferencePlan, seed: int) -> dict[str, dict]:
    """Every device's weights, cut from one model built here."""
    from hppctl.runtime.galaxy.weights import build_base_model, device_shard, extract, ranges

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
    heads, columns = ranges([s.heads for s in plan.shares]), ranges([s.columns for s in plan.shares])
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


def _blob(obj) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


class InferenceSession:
    def __init__(self, request: InferenceRequest) -> None:
        self.request = request
        self.workers: dict[str, Any] = {}
        self.store: bootstrap.RunStore | None = None
        self.on_phase: Callable[[str], None] = lambda phase: None
        """Called as the run enters "model" (build and cut the weights), "workers" (start and join)
        and "passes" (warm-up and timed passes)."""
        self.on_step: Callable[[StepProgress], None] | None = None
        """Called with the slowest device's passes done, as the workers report them."""

    def run(self) -> InferenceResult:
        req, plan = self.request, self.request.plan
        refuse_over_budget(plan)
        self._check_devices()
        prepare_local_workers(req.cluster, [s.device for s in plan.shares], req.env)
        started = time.perf_counter()
        self.on_phase("model")
        parts = shards(plan, req.seed)
        self.ids = token_ids(req, next(iter(parts.values()))["embed"]["word"].shape[0])
        trimmed = {d: for_request(shard, self.ids) for d, shard in parts.items()}
        parts, local_ids = {d: t[0] for d, t in trimmed.items()}, next(iter(trimmed.values()))[1]
        self.store = bootstrap.RunStore.start(*self._listen_address(), timeout_s=req.timeout_s)
        try:
            for device, shard in parts.items():
                bootstrap.put_blob(self.store.store, f"shard/{device}", _blob(shard))
            del parts
            bootstrap.put_blob(self.store.store, "ids", _blob(local_ids))
            nonce = self.store.publish_nonce()
            self.on_phase("workers")
            self._launch()
            self._admit(nonce)
            self.on_phase("passes")
            reports = self._wait_reports()
            output = _load(bootstrap.get_blob(self.store.store, "output", delete=True))
        finally:
            stop_workers(self.workers.values())
            self.store.close()
        return InferenceResult(output, reports, time.perf_counter() - started, plan, self._overlap(), self._ring_rate(),
                               req.wire_dtype)

    def _ring_rate(self) -> float:
        names = self.request.plan.devices()
        if len(names) < 2:
            return 0.0
        return min(self.request.cluster.bandwidth_between(a, b) for a, b in zip(names, names[1:] + names[:1]))

    def _overlap(self) -> bool:
        return self.request.overlap and self.request.plan.strategy == "galaxy"

    def _check_devices(self) -> None:
        for share in self.request.plan.shares:
            try:
                spec = self.request.cluster.device(share.device)
            except KeyError:
                raise BadInput(f"--cluster: the plan's device {share.device!r} is not in the inventory") from None
            if spec.preset is not None:
                raise BadInput(f"--cluster: device {share.device!r} is a preset (a model of a device): "
                               f"runs need local: or host: devices")

    def _listen_address(self) -> tuple[str, int]:
        if self.request.listen:
            return bootstrap.parse_listen(self.request.listen)
        remote = [s.device for s in self.request.plan.shares if self.request.cluster.device(s.device).host]
        return (bootstrap.route_source(self.request.cluster.device(remote[0]).host) if remote else "127.0.0.1"), 0

    def _launch(self) -> None:
        req, plan = self.request, self.request.plan
        rows = split_rows(len(self.ids), len(plan.shares))  # megatron runs every row; only its ring's size matters
        for rank, share in enumerate(plan.shares):
            config = InferenceWorkerConfig(
                device=share.device, rank=rank, world_size=len(plan.shares), store_host=self.store.host,
                store_port=self.store.port, strategy=plan.strategy, row_sizes=rows, overlap=self._overlap(),
                repeats=req.repeats, warmup=req.warmup, threads=req.threads,
                budget_bytes=share.memory_budget_bytes, wire_dtype=req.wire_dtype, timeout_s=req.timeout_s,
                progress_every_s=req.progress_every_s)
            payload = json.dumps({"token": self.store.token, "config": config.model_dump(mode="json")})
            spec = req.cluster.device(share.device)
            if spec.host is not None:
                self.workers[share.device] = SshWorker(spec, req.cluster, payload, pid_of=self._pid_of, log=req.log,
                                                       env=req.env, module=WORKER_MODULE)
            else:
                self.workers[share.device] = LocalWorker(share.device, payload, env=req.env, log=req.log,
                                                         module=WORKER_MODULE)

    def _pid_of(self, device: str) -> int | None:
        key = f"pid/{device}"
        if self.store is None or not self.store.store.check([key]):
            return None
        words = bootstrap.read_line(self.store.store, key).split()
        return int(words[-1]) if words and words[-1].isdigit() else None

    def _admit(self, nonce: str) -> None:
        waiting = set(self.workers)
        deadline = time.monotonic() + self.request.timeout_s
        while waiting:
            self._check_alive()
            for device in sorted(waiting):
                ok = self.store.joined(device, nonce)
                if ok is False:
                    raise RuntimeFailure(f"{device}: join refused (wrong run token)")
                if ok:
                    waiting.discard(device)
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"timed out after {self.request.timeout_s:.0f} s waiting for "
                                     f"{', '.join(sorted(waiting))} to join")
            time.sleep(0.05)
        self.store.store.set("start", "1")

    def _wait_reports(self) -> dict[str, dict]:
        store, devices = self.store.store, list(self.workers)
        steps = Throttle(self.request.progress_every_s)
        while not store.check([f"done/{d}" for d in devices]):
            self._check_alive()
            if self.on_step is not None and steps.due():
                step = slowest(read_steps(store, devices), 0)
                if step is not None:
                    self.on_step(step)
            time.sleep(0.02)
        return {d: bootstrap.read_json(store, f"timings/{d}") for d in devices}

    def _check_alive(self) -> None:
        for device, worker in self.workers.items():
            code = worker.poll()
            if code not in (None, 0):
                self._fail(device, code)
            if self.store.store.check([f"failed/{device}"]):
                self._fail(device, code)

    def _fail(self, device: str, code: int | None) -> None:
        key = f"failed/{device}"
        message = bootstrap.read_line(self.store.store, key, bootstrap.MAX_MESSAGE_BYTES) if self.store.store.check([key]) else ""
        if message.startswith("Infeasible: "):
            raise Infeasible(message.removeprefix("Infeasible: "))
        time.sleep(0.2)  # let the worker's traceback reach its tail
        lines = [line for line in self.workers[device].tail() if line.strip()][-12:]
        detail = "\n".join(f"    {line}" for line in lines)
        raise RuntimeFailure(f"inference worker on device {device} failed"
                             + (f" (exit {code})" if code is not None else "") + (f": {message}" if message else "")
                             + (f"\n  last lines:\n{detail}" if detail else ""))


def _load(data: bytes):
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


def run_inference(request: InferenceRequest, *, on_phase: Callable[[str], None] | None = None,
                  on_step: Callable[[StepProgress], None] | None = None) -> InferenceResult:
    """Run the request; on_phase and on_step: `InferenceSession`'s progress hooks."""
    session = InferenceSession(request)
    if on_phase is not None:
        session.on_phase = on_phase
    session.on_step = on_step
    return session.run()
