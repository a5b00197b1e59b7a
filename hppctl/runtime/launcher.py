"""The launcher's side of every run kind, once: host the store, ship, launch, admit, watch, stop.

`Launcher._run_workers` owns the order (store → `ship` → nonce → launch → admit → running phase →
`collect` → stop and close, whatever happens) and the machinery: listen address, one worker per
device (local subprocess or SSH), pids, join proofs, liveness and failure messages, step progress.
Launching installs the run's `--workdir` on each SSH device over the connection that starts its
worker and tells every worker where it is (`user_code`, runtime/workdir.py), whatever the run kind.
A subclass says what differs: `_devices`, `worker_module`, and per run the `ship`, `config_of` and
`collect` it passes (runtime/session.py: training; psl/session.py: PSL; galaxy/launch.py: inference).
"""

from __future__ import annotations

import io
import json
import time
from typing import Callable, ClassVar, TypeVar

from pydantic import BaseModel, ValidationError

from hppctl.errors import BadInput, Infeasible, RuntimeFailure
from hppctl.models.reports import RoundReport
from hppctl.runtime import bootstrap, wire
from hppctl.runtime.launch import (WORKER_MODULE, LocalWorker, SshWorker, WorkerProcess, prepare_local_workers,
                                   stop_workers)
from hppctl.runtime.progress import StepProgress, Throttle, read_steps, slowest
from hppctl.runtime.workdir import BAD_INPUT_PREFIX, RunUserCode

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class WorkerFailed(RuntimeFailure):
    """A worker exited with an error or reported one."""


def to_blob(obj) -> bytes:
    """`obj` as `torch.save` bytes (what `bootstrap.put_blob` ships); `from_blob` reads them back."""
    import torch

    torch.save(obj, buf := io.BytesIO())
    return buf.getvalue()


def from_blob(data: bytes):
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


def last_end(rows: list[dict]) -> float | None:
    """When the last metrics row's round ended (the next row's round time starts there), None before the first."""
    return rows[-1]["ended_at"] if rows else None


def add_row(rows: list[dict], row: dict, on_round: Callable[[dict], None] | None) -> None:
    rows.append(row)
    if on_round:
        on_round(row)


class Launcher:
    worker_module: ClassVar[str] = WORKER_MODULE
    worker_noun: ClassVar[str] = "worker"
    """How failure messages name a worker ("inference worker on device d1 failed …")."""
    running_phase: ClassVar[str] = "training"
    """The phase `on_phase` announces once every worker joined."""
    report_type: ClassVar[type[BaseModel]] = RoundReport
    """What a worker's `metrics/<round>/<device>` report is (models/reports.py)."""
    fail_on_report: ClassVar[bool] = False
    """Fail as soon as a worker reports an error (`failed/…`), before it exits; else on its exit."""

    def __init__(self, request) -> None:
        """`request`: the run kind's request; every one has `cluster`, `listen`, `log` and `env`."""
        self.request = request
        self.workers: dict[str, WorkerProcess] = {}
        self.store: bootstrap.RunStore | None = None
        self.on_phase: Callable[[str], None] = lambda phase: None
        """Called as the run enters a phase: "workers" (start and join), then `running_phase`."""
        self.start_round = 0
        """The round the run starts from (a resumed run's checkpoint round), set before `on_phase`."""
        self.on_step: Callable[[StepProgress], None] | None = None
        """Called with the slowest device's progress within the running round, when the workers
        report one (long rounds: an nf1b or pipedream epoch, Galaxy's passes; runtime/progress.py)."""
        self.user_code: RunUserCode | None = None
        """The run's `--workdir` and user modules (runtime/workdir.py), set by the driver before `run`:
        installed on each SSH device as its worker starts, told to every worker (`user_code` of its
        config), and `user_code.sent` records the bytes each device was sent."""

    # --- hooks --------------------------------------------------------------------------------------
    def _devices(self) -> list[str]:
        """The devices that run a worker: the topology's (`self.topo`: a training or PSL run's)."""
        return list(self.topo.devices)

    def _model(self) -> str | None:
        """The model the run's workers build their stages of, when they trace it (a training run's)."""
        return None

    def _worker_config(self, config: BaseModel) -> BaseModel:
        """What a worker is told, from the subclass's config (fault tolerance adds its coordinator)."""
        return config

    # --- the run, owned once --------------------------------------------------------------------------
    def _prepare(self) -> None:
        """Start the local worker zygote early (runtime/launch.py), overlapping the run's own preparation."""
        prepare_local_workers(self.request.cluster, self._devices(), self.request.env, model=self._model())

    def _run_workers(self, timeout_s: float, *, ship: Callable[[object], None], config_of: Callable[[str], BaseModel],
                     collect: Callable[[], T], notify: Callable[[str], None] | None = None) -> T:
        """`ship(store)` what the workers load first, start and admit one per device (`config_of(device)`:
        what it is told), `collect()` the result; the workers are stopped and the store closed whatever happens."""
        notify, self.store = notify or (lambda message: None), self._host_store(timeout_s)
        try:
            ship(self.store.store)
            nonce = self.store.publish_nonce()
            self._launch(config_of)
            notify(f"started {len(self.workers)} workers; store on {self.store.host}:{self.store.port}")
            self._admit(nonce, timeout_s)
            notify("all workers joined")
            self.on_phase(self.running_phase)
            return collect()
        except Exception as e:
            failure = self.store.failure(e)
            if failure is None:
                raise
            raise failure from e
        finally:
            self._stop_all()
            self.store.close()

    def _host_store(self, timeout_s: float) -> bootstrap.RunStore:
        """The run's store: on `listen`, else 127.0.0.1 when every device is local, else the address
        this machine uses to reach the first SSH device."""
        host, port, cluster = "127.0.0.1", 0, self.request.cluster
        if self.request.listen:
            host, port = bootstrap.parse_listen(self.request.listen)
        else:
            remote = [d for d in self._devices() if cluster.device(d).host is not None]
            if remote:
                host = bootstrap.route_source(cluster.device(remote[0]).host)
        return bootstrap.RunStore.start(host, port, timeout_s=timeout_s)

    def _launch(self, config_of: Callable[[str], BaseModel]) -> None:
        req, code = self.request, self.user_code
        for device in self._devices():
            spec = req.cluster.device(device)
            config = self._worker_config(config_of(device))
            if code is not None:  # every worker kind's config has `user_code` (worker_entry reads it)
                config = config.model_copy(update={"user_code": code.for_device(local=spec.host is None)})
            # without user code the field stays off the wire: the config a worker reads is the one it read before it
            unused = {"user_code"} if code is None else None
            payload = json.dumps({"token": self.store.token, "config": config.model_dump(mode="json", exclude=unused)})
            if spec.host is not None:
                worker = SshWorker(spec, req.cluster, payload, pid_of=self._pid_of, log=req.log, env=req.env,
                                   module=self.worker_module, workdir=code.workdir if code is not None else None)
                self.workers[device] = worker
                if code is not None and code.workdir is not None:
                    code.sent[device] = worker.workdir_sent
            else:
                self.workers[device] = LocalWorker(device, payload, env=req.env, log=req.log, module=self.worker_module)
                if code is not None and code.workdir is not None:
                    code.sent[device] = None

    def _stored(self, key: str) -> bool:
        """Whether `key` is in the run's store, asked only while the store answers (not once closed,
        nor once its address left: runtime/address_watch.py)."""
        return self.store is not None and self.store.answers and self.store.store.check([key])

    def _pid_of(self, device: str) -> int | None:
        key = wire.pid(device)
        if not self._stored(key):
            return None
        words = bootstrap.read_line(self.store.store, key).split()
        return int(words[-1]) if words and words[-1].isdigit() else None

    def _admit(self, nonce: str, timeout_s: float) -> None:
        waiting = set(self._devices())
        deadline = time.monotonic() + timeout_s
        while waiting:
            self._check_alive()
            for device in sorted(waiting):
                ok = self.store.joined(device, nonce)
                if ok is False:
                    raise WorkerFailed(f"{device}: join refused (wrong run token)")
                if ok:
                    waiting.discard(device)
            if time.monotonic() > deadline:
                raise WorkerFailed(f"timed out after {timeout_s:.0f} s waiting for {', '.join(sorted(waiting))} "
                                   f"to join")
            time.sleep(0.05)
        self.store.store.set(wire.start(), "1")

    # --- watching ---------------------------------------------------------------------------------
    def _take_round(self, round_index: int) -> dict[str, BaseModel] | None:
        """Every device's report of round `round_index` (a `report_type`, read and deleted), None until all are in."""
        return bootstrap.take_round(self.store.store, round_index, self._devices(),
                                    lambda device, key: self._read_document(device, key, self.report_type))

    def _read_document(self, device: str, key: str, model: type[M]) -> M:
        """`device`'s document under `key`, read bounded and typed: one it cannot have written as
        `model` (another build's, a truncated one) is that device's failure, one line."""
        try:
            return model.model_validate_json(bootstrap.read_value(self.store.store, key, bootstrap.MAX_VALUE_BYTES))
        except ValidationError as e:  # the project's one formatter: first error, values shortened
            from hppctl.store import describe_validation_error

            raise WorkerFailed(f"{self.worker_noun} on device {device} sent a malformed "
                               + describe_validation_error(repr(key), e)) from None

    def _all_done(self) -> bool:
        return self.store.store.check(wire.done_keys(self._devices()))

    def _show_progress(self, throttle: Throttle, round_index: int) -> None:
        """Pass the slowest device's progress in round `round_index` to `on_step`, when due."""
        if self.on_step is not None and throttle.due():
            step = slowest(read_steps(self.store.store, self._devices()), round_index)
            if step is not None and step.round == round_index:
                self.on_step(step)

    # --- liveness -----------------------------------------------------------------------------------
    def _check_alive(self) -> None:
        for device, worker in self.workers.items():
            code = worker.poll()
            if code not in (None, 0):
                self._on_worker_exit(device, code)
            if self.fail_on_report and self._reported_failure(device):
                self._fail(device, code)

    def _on_worker_exit(self, device: str, code: int) -> None:
        """A worker ended with an error: the run fails (fault tolerance suspects the device instead)."""
        self._fail(device, code)

    def _reported_failure(self, device: str) -> str:
        """The error `device` reported (`failed/…`), "" if none."""
        key = wire.failed(device)
        if not self._stored(key):
            return ""
        return bootstrap.read_line(self.store.store, key, bootstrap.MAX_MESSAGE_BYTES)[:2000]

    def _fail(self, device: str, code: int | None) -> None:
        """Fail the run naming `device`, its error and its last output lines; a plan the worker found
        infeasible (it reported `Infeasible: …`, e.g. over its memory budget) is `Infeasible` (exit 3)."""
        message = self._reported_failure(device)
        if message.startswith("Infeasible: "):
            raise Infeasible(message.removeprefix("Infeasible: "))
        if message.startswith(BAD_INPUT_PREFIX):  # a user module that does not import there (runtime/workdir.py)
            raise BadInput(message.removeprefix(BAD_INPUT_PREFIX))
        time.sleep(0.2)  # let the worker's traceback reach its tail
        lines = [line for line in self.workers[device].tail() if line.strip()][-12:]
        detail = "\n".join(f"    {line}" for line in lines)
        exit_code = f" (exit {code})" if code is not None else ""
        raise WorkerFailed(f"{self.worker_noun} on device {device} failed{exit_code}" + (f": {message}" if message else "")
                           + (f"\n  last lines:\n{detail}" if detail else ""))

    def _stop_all(self) -> None:
        stop_workers(self.workers.values())
