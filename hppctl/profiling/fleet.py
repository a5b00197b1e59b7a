"""Reaching the measured devices of a cluster: connect, install or check hppctl, run a probe kind on all.

`profile_cluster` (cluster.py) uses `prepare` for each device. Other measurements reuse the same
machinery with `probe_devices`, e.g. Galaxy's inference-block latencies with a probe kind of their
own (probe.py explains how a kind is registered):

    from hppctl.profiling.fleet import probe_devices

    results, failures = probe_devices(cluster, "inference-blocks", {"model": "bert-large"},
                                      imports=["hppctl.galaxy.probe"], timeout_s=1800)
    results["nx0"]     # the records that kind printed on device nx0 (parse them with parse.records' output)
    failures["pi0"]    # or why that device failed: one line

Devices run in parallel (`local:` ones one after the other: they share this machine), each on its
own connection; a device's failure is collected, not raised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from hppctl import __version__
from hppctl.models.cluster import ClusterSpec, DeviceSpec
from hppctl.profiling.remote import DeviceFailure, endpoint_for

EndpointFactory = Callable[[DeviceSpec, ClusterSpec], Any]
Phase = Callable[[str, str], None]


def prepare(spec: DeviceSpec, endpoint, *, wheel: Path | None = None, phase: Phase | None = None) -> None:
    """Connect; with a wheel, install it into the device's venv (host: devices); then make sure the
    device runs this hppctl version. `DeviceFailure` with a one-line reason otherwise."""
    phase = phase or (lambda name, text: None)
    phase(spec.name, "connecting")
    endpoint.open()
    if wheel is not None and spec.host is not None:
        from hppctl.profiling.install import install

        phase(spec.name, "installing hppctl")
        install(endpoint, wheel)
    if spec.host is not None or spec.python is not None:
        phase(spec.name, "checking the hppctl version")
        version = endpoint.version()
        if version is None:
            raise DeviceFailure(f"hppctl is not installed for {endpoint.python} on the device "
                                f"(run with --install to put this hppctl {__version__} there)")
        if version != __version__:
            raise DeviceFailure(f"hppctl {version} on the device, {__version__} here: versions must match "
                                f"(run with --install to put this one there)")


def run_lanes(specs: Sequence[DeviceSpec], work: Callable[[DeviceSpec], None],
              on_interrupt: Callable[[], None] = lambda: None) -> None:
    """`work(spec)` for every device: each remote device on its own thread, the local ones one after the
    other on one more. Returns when all are done; Ctrl-C calls `on_interrupt` and propagates."""
    remote = [[d] for d in specs if not d.local]
    local = [d for d in specs if d.local]
    lanes = remote + ([local] if local else [])
    if not lanes:
        return

    def lane(devices: list[DeviceSpec]) -> None:
        for spec in devices:
            work(spec)

    pool = ThreadPoolExecutor(max_workers=len(lanes), thread_name_prefix="hppctl-profile")
    futures = [pool.submit(lane, devices) for devices in lanes]
    try:
        while wait(futures, timeout=0.5).not_done:
            pass  # short waits keep the main thread responsive to Ctrl-C
    except KeyboardInterrupt:
        on_interrupt()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    for future in futures:
        future.result()  # a bug in `work` itself surfaces here


def probe_devices(cluster: ClusterSpec, kind: str, args: dict[str, Any] | Callable[[DeviceSpec], dict[str, Any]], *,
                  imports: Sequence[str] = (), timeout_s: float | None = None, install_wheel: Path | None = None,
                  on_record: Callable[[str, dict[str, Any]], None] | None = None,
                  endpoint_factory: EndpointFactory = endpoint_for) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """Run probe `kind` on every measured (`host:`/`local:`) device; (records per device, failures per device).

    `args` is one dict for all devices or a function of the device. `imports` are modules the probe
    imports first (the ones that register `kind`). `on_record(device, record)` sees records as they
    arrive (for progress bars).
    """
    results: dict[str, list[dict]] = {}
    failures: dict[str, str] = {}
    endpoints: dict[str, Any] = {}
    lock = threading.Lock()

    def work(spec: DeviceSpec) -> None:
        try:
            endpoint = endpoint_factory(spec, cluster)
            with lock:
                endpoints[spec.name] = endpoint
            prepare(spec, endpoint, wheel=install_wheel)
            device_args = args(spec) if callable(args) else args
            callback = (lambda record: on_record(spec.name, record)) if on_record else None
            found = endpoint.probe(kind, device_args, on_record=callback, timeout=timeout_s, imports=imports)
            with lock:
                results[spec.name] = found
        except DeviceFailure as e:
            with lock:
                failures[spec.name] = e.reason
        except Exception as e:  # noqa: BLE001 - one device's failure must not lose the others' results
            with lock:
                failures[spec.name] = f"{e.__class__.__name__}: {e}"

    def close_all() -> None:
        for endpoint in list(endpoints.values()):
            endpoint.close()

    try:
        run_lanes([d for d in cluster.devices if d.preset is None], work, close_all)
    finally:
        close_all()
    return results, failures
