"""A fake device endpoint for profile_cluster tests: it answers the probes with made-up but well-formed
records (a device of `speed` relative cores running `layers` layers), and can fail on cue."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from hppctl import __version__
from hppctl.profiling.probe import PROBE_VERSION
from hppctl.profiling.remote import DeviceFailure


@dataclass
class FakeDevice:
    """What a fake device is like, and how it misbehaves."""

    quota: float = 1.0
    layers: int = 5
    version: str | None = __version__
    probe_version: int | None = PROBE_VERSION
    """What its identify probe reports (None: a probe older than version 5, which reported none)."""
    refuse: str | None = None
    """Reason to fail `open()` with (e.g. an unreachable host)."""
    die_after_passes: int | None = None
    """Stop the train probe (as if interrupted) after this many pass records."""
    killed_at: int | None = None
    """Batch size at which the kernel 'kills' the train probe in its memory phase."""
    calls: list[tuple[str, dict]] = field(default_factory=list)
    memory_limit: int | None = 2 * 10**9
    link_failure: str | None = None
    """Reason its link server fails with (e.g. it saw only strangers)."""
    slow_batch: int | None = None
    """Batch size whose passes take 100x longer in the first `slow_runs` train probes (other work)."""
    slow_runs: int = 0


class FakeRunning:
    def __init__(self, records, failure: str | None = None):
        self.records, self.failure = records, failure

    def wait(self):
        if self.failure:
            raise DeviceFailure(self.failure, self.records)
        return self.records


class FakeEndpoint:
    addresses: dict[str, str] = {}
    lock = threading.Lock()

    def __init__(self, name: str, device: FakeDevice) -> None:
        self.name, self.device, self.python = name, device, "python3"
        self.closed = False

    def open(self) -> None:
        if self.device.refuse:
            raise DeviceFailure(self.device.refuse)

    def version(self) -> str | None:
        return self.device.version

    def close(self) -> None:
        self.closed = True

    def address_for(self, peer) -> str:
        return f"addr-{self.name}"

    def probe(self, kind: str, args: dict[str, Any], *, on_record=None, timeout=None, imports=()):
        with self.lock:
            self.device.calls.append((kind, args))
        records = list(getattr(self, "_" + kind.replace("-", "_"))(args, on_record or (lambda r: None)))
        return records + [{"type": "done", "seconds": 0.0}]

    def start_probe(self, kind: str, args: dict[str, Any], *, timeout=None):
        with self.lock:
            self.device.calls.append((kind, args))
        assert kind == "link-serve", kind
        return FakeRunning([{**self._received(), "bound": args["bind"]}, {"type": "send", "bytes": 1, "seconds": 1.0},
                            {"type": "echo", "bound": args["bind"], "echoed": 3}, {"type": "done", "seconds": 1.0}],
                           self.device.link_failure)

    def _received(self) -> dict:
        """What this device's receiver reads: the rate follows its quota (a slow receiver reads slowly)."""
        rate = 12e6 * min(1.0, self.device.quota + 0.5)
        return {"type": "recv", "bytes": int(rate), "seconds": 1.0, "bytes_per_s": rate}

    # -- probe kinds ------------------------------------------------------------------------

    def _emit(self, on_record, records, record):
        records.append(record)
        on_record(record)

    def _identify(self, args, on_record):
        record = {"type": "identity", "hostname": self.name, "machine": "x86_64", "cpu_model": "Fake CPU", "cpus": 4,
                  "cpu_quota_cores": self.device.quota, "cpu_quota_source": "cgroup v2",
                  "threads": args.get("threads") or 1, "threads_source": "quota", "memory_total_bytes": 8 * 10**9,
                  "memory_available_bytes": 6 * 10**9, "memory_limit_bytes": self.device.memory_limit,
                  "memory_limit_source": "cgroup v2", "omp_num_threads": None, "python": "3.11.7",
                  "torch": "2.13.0", "transformers": "5.0", "hppctl": __version__, "kernel": "6.1",
                  **({"probe_version": self.device.probe_version} if self.device.probe_version else {})}
        on_record(record)
        yield record

    def _train(self, args, on_record):
        records: list[dict] = []
        emit = lambda r: self._emit(on_record, records, r)  # noqa: E731
        emit({"type": "setup", "layers": self.device.layers, "threads": args["threads"], "clock": "cpu",
              "runtime_bytes": 4 * 10**8, "model_bytes": 10**6, "param_bytes": 10**6, "setup_s": 1.0})
        sizes = sorted(args["batch_sizes"])
        self.device.train_runs = getattr(self.device, "train_runs", 0) + 1
        slow = self.device.slow_batch if self.device.train_runs <= self.device.slow_runs else None
        for b in sizes:
            emit({"type": "progress", "batch_size": b, "phase": "memory", "done": 0, "total": len(sizes)})
            if self.device.killed_at is not None and b >= self.device.killed_at:
                raise DeviceFailure(f"probe 'train' was killed at batch {b} (memory) (SIGKILL: out of memory?)",
                                    records)
            emit({"type": "memory", "batch_size": b, "peak_bytes": 10**6 * b, "peak_method": "fake", "notes": [],
                  "optimizer_step_s": [0.001]})
        passes = 0
        for r in range(max(int(n) for n in args["passes"].values())):
            for b in sizes:
                if r >= int(args["passes"][str(b)]):
                    continue
                if self.device.die_after_passes is not None and passes >= self.device.die_after_passes:
                    raise DeviceFailure("probe 'train' exited with -1: connection lost", records)
                cpu = 0.001 * b * (100 if b == slow else 1)
                emit({"type": "pass", "batch_size": b,
                      "forward": [cpu * (i + 1) / 10 for i in range(self.device.layers)],
                      "backward": [2 * cpu * (i + 1) / 10 for i in range(self.device.layers)],
                      "weight_grad": [cpu * (i + 1) / 10 for i in range(self.device.layers)],
                      "step": {"count": 2, "wall_s": 2 * 1.5 * cpu / self.device.quota, "cpu_s": 2 * 1.5 * cpu,
                               "clock_s": [1.5 * cpu, 1.5 * cpu]}})
                passes += 1
        yield from []

    def _link_test(self, args, on_record):
        yield {"type": "send", "bytes": 1, "seconds": 1.0}
        yield {**self._received(), "bound": self.address_for(None)}
        yield {"type": "ping", "rtt_s": [0.001, 0.002, 0.003]}


def factory(devices: dict[str, FakeDevice]):
    endpoints: dict[str, FakeEndpoint] = {}

    def make(spec, cluster):
        endpoints[spec.name] = FakeEndpoint(spec.name, devices[spec.name])
        return endpoints[spec.name]

    make.endpoints = endpoints
    return make
