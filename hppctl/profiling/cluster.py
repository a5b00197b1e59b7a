"""Profile a whole cluster: every device in parallel, then every link one pair at a time.

The function API (`hppctl profile` is a thin shell around it; `hppctl demo` calls it directly):

    from hppctl.profiling.cluster import ProbeSettings, profile_cluster

    run = profile_cluster(cluster, "mobilenetv2", granularity="fine", batch_sizes=[1, 2, 4, 8],
                          settings=ProbeSettings(repeats=5), force=False, install=False)
    run.profile        # Profile (None only if no device could be profiled)
    run.failures       # {device or "a-b link": reason}; the profile lists failed devices as missing

`preset:` devices get timings from their device model (docs/presets.md), `local:` devices run the
probe as a subprocess of this interpreter, `host:` devices over SSH (remote.py). Devices are
measured in parallel, except that `local:` devices share this machine and so run one after the
other. Each device's batch records go to the measurement cache (cache.py) as they arrive.
Links between measured devices are measured after the devices, one pair at a time and one
direction at a time, so that no two measurements share a CPU or a wire.

Library code: it reports progress to an `Observer` (the CLI draws rich progress bars) and never
prints.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hppctl import __version__
from hppctl.errors import BadInput
from hppctl.models.cluster import ClusterSpec, DeviceSpec
from hppctl.models.profile import DeviceProfile, LayerCost, LinkProfile, MissingDevice, Profile
from hppctl.profiling import parse
from hppctl.profiling.cache import MeasurementCache, default_root
from hppctl.profiling.from_presets import (DEFAULT_BATCH_SIZES, pair_links, preset_device_profile,
                                          validate_batch_sizes)
from hppctl.profiling.presets import get_preset
from hppctl.profiling.probe import PROBE_VERSION
from hppctl.profiling.records import Identity, Memory, Pass
from hppctl.profiling.fleet import prepare, run_lanes
from hppctl.profiling.links import link_text, measure_link, merge_links
from hppctl.profiling.remote import DeviceFailure, ProbeCode, endpoint_for
from hppctl.profiling.sanity import implausible_batch_sizes, implausible_steps, share_machine_memory, timing_warning


@dataclass(frozen=True, kw_only=True)
class ProbeSettings:
    """How hard to measure. Every field that changes a number is part of the cache key."""

    repeats: int = 7
    """Timed passes per batch size (medians over these)."""
    warmup: int = 2
    """Untimed passes first (allocator, caches, lazy initialisation)."""
    window_s: float = 1.0
    """Whole steps run back to back for at least this long (wall) for the sustained factor."""
    min_steps: int = 3
    threads: int | None = None
    """torch threads; None: ceil of the device's CPU quota (device.py)."""
    timeout_s: float = 3600.0
    """Limit on one device's training probe."""
    link_seconds: float = 2.0
    """Length of each one-way transfer."""
    ping_count: int = 20

    def __post_init__(self) -> None:
        # (flag a user types, value, smallest allowed, whether the smallest itself is allowed)
        checks = (("--repeats", self.repeats, 1, True), ("--warmup", self.warmup, 0, True),
                  ("--timeout", self.timeout_s, 0, False), ("--link-seconds", self.link_seconds, 0, False),
                  ("window_s", self.window_s, 0, True), ("min_steps", self.min_steps, 1, True),
                  ("ping_count", self.ping_count, 1, True))
        for flag, value, least, inclusive in checks:
            if value < least or (value == least and not inclusive):
                bound = f">= {least}" if inclusive else f"> {least}"
                raise BadInput(f"{flag}: must be {bound} (got {value})")
        if self.threads is not None and self.threads < 1:
            raise BadInput(f"--threads: {self.threads} is not a positive number of threads")

    def key(self) -> dict[str, Any]:
        return {"repeats": self.repeats, "warmup": self.warmup, "window_s": self.window_s,
                "min_steps": self.min_steps, "threads": self.threads}


class Observer:
    """Progress callbacks (called from worker threads). The default does nothing."""

    def device_phase(self, name: str, text: str, done: float | None = None, total: float | None = None) -> None: ...

    def device_done(self, name: str, text: str) -> None: ...

    def device_failed(self, name: str, reason: str) -> None: ...

    def link(self, a: str, b: str, text: str) -> None: ...

    def note(self, text: str) -> None: ...


@dataclass
class ProfileRun:
    profile: Profile | None
    failures: dict[str, str] = field(default_factory=dict)
    measured: dict[str, list[int]] = field(default_factory=dict)
    """Batch sizes measured in this run, per device."""
    cached: dict[str, list[int]] = field(default_factory=dict)
    """Batch sizes taken from the cache, per device."""
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    workdir: dict[str, int | None] = field(default_factory=dict)
    """With `user_code`: bytes of the workdir sent to each device (0: it held it; None: local, used in place)."""


EndpointFactory = Callable[[DeviceSpec, ClusterSpec], Any]


@dataclass
class _Context:
    cluster: ClusterSpec
    model: str
    granularity: str
    layers: list[LayerCost]
    grid: list[int]
    settings: ProbeSettings
    force: bool
    cache_root: Path
    observer: Observer
    wheel: Path | None
    model_fingerprint: str | None
    run: ProfileRun
    interrupted: bool = False
    parts: list[list[LayerCost]] | None = None
    """For presets at block granularity: the fine layers of each block (a block is timed as their sum)."""
    code: ProbeCode | None = None
    """The user's `--workdir` the probes run with (remote.ProbeCode), or None."""
    lock: threading.Lock = field(default_factory=threading.Lock)


def profile_cluster(cluster: ClusterSpec, model: str, *, granularity: str = "fine",
                    batch_sizes: Sequence[int] | None = None, optimizer_state_factor: float = 1.0,
                    settings: ProbeSettings | None = None, force: bool = False, install: bool = False,
                    measure_links: bool = True, cache_root: Path | None = None, observer: Observer | None = None,
                    layers: list[LayerCost] | None = None, endpoint_factory: EndpointFactory = endpoint_for,
                    source: str | None = None, user_code: ProbeCode | None = None) -> ProfileRun:
    """Profile every device and link of `cluster` for `model` (module docstring). Raises `BadInput` for
    a bad cluster or model before connecting anywhere; device failures are collected, not raised.
    `user_code`: the `--workdir` every measured device's probes run with, installed on each SSH
    device over its own connection once it is open (`run.workdir`: the bytes each was sent)."""
    started = time.perf_counter()
    settings = settings or ProbeSettings()
    grid = validate_batch_sizes(list(DEFAULT_BATCH_SIZES) if batch_sizes is None else list(batch_sizes))
    where = f"{source}: " if source else ""
    presets = {d.name: get_preset(d.preset, device=d.name, source=f"{where}devices.{i}.preset")
               for i, d in enumerate(cluster.devices) if d.preset is not None}
    if layers is None:
        from hppctl.zoo import layer_costs

        layers = layer_costs(model, granularity)
    observer = observer or Observer()
    run = ProfileRun(profile=None)
    wheel = None
    measured_specs = [d for d in cluster.devices if d.preset is None]
    if install and any(d.host is not None for d in measured_specs):
        from hppctl.profiling.install import build_wheel

        observer.note("building the hppctl wheel for --install")
        wheel = build_wheel((cache_root or default_root()).parent / "wheels")
    ctx = _Context(cluster, model, granularity, list(layers), grid, settings, force, cache_root or default_root(),
                   observer, wheel, _model_fingerprint(model), run)
    ctx.code = user_code
    if presets and granularity == "block":
        ctx.parts = _block_parts(model, ctx.layers)
    endpoints: dict[str, Any] = {}
    results = _measure_devices(ctx, measured_specs, endpoints, endpoint_factory)
    results = _shared_memory(ctx, measured_specs, results)
    try:
        devices: list[DeviceProfile] = []
        for spec in cluster.devices:
            if spec.preset is not None:
                devices.append(_preset_device(spec, presets[spec.name], ctx))
            elif spec.name in results:
                devices.append(results[spec.name])
        links = pair_links(cluster)
        ok = [d.name for d in measured_specs if d.name in results]
        if measure_links and len(ok) > 1:
            links = merge_links(links, _measure_links(ctx, ok, endpoints))
        run.profile = _assemble(ctx, devices, links, optimizer_state_factor) if devices else None
    finally:
        for endpoint in endpoints.values():
            endpoint.close()
    run.seconds = time.perf_counter() - started
    return run


def _block_parts(model: str, layers: list[LayerCost]) -> list[list[LayerCost]] | None:
    from hppctl.profiling.from_presets import group_layers
    from hppctl.zoo import nested_fine_layers

    fine = nested_fine_layers(model)  # None: a user model traced to its blocks only
    return group_layers(layers, fine) if fine is not None else None


def _model_input(model: str) -> dict[str, Any] | None:
    """A user model's input spec for the probe (zoo/user.py); None for a zoo model."""
    from hppctl.zoo.user import recorded_input

    found = recorded_input(model)
    return found.model_dump(mode="json") if found is not None else None


def _model_fingerprint(model: str) -> str | None:
    from hppctl.zoo import get_model

    return get_model(model).fingerprint()


# ---------------------------------------------------------------------------------------------
# devices
# ---------------------------------------------------------------------------------------------


def _measure_devices(ctx: _Context, specs: list[DeviceSpec], endpoints: dict[str, Any],
                     factory: EndpointFactory) -> dict[str, DeviceProfile]:
    """Every measured device through `_profile_device`, in parallel lanes (fleet.run_lanes)."""
    results: dict[str, DeviceProfile] = {}

    def work(spec: DeviceSpec) -> None:
        try:
            endpoint = factory(spec, ctx.cluster)
            with ctx.lock:
                endpoints[spec.name] = endpoint
            profile = _profile_device(ctx, spec, endpoint)
        except DeviceFailure as e:
            _fail(ctx, spec.name, e.reason)
        except Exception as e:  # noqa: BLE001 - one device's bug must not lose the others' results
            _fail(ctx, spec.name, f"{e.__class__.__name__}: {e}")
        else:
            with ctx.lock:
                results[spec.name] = profile

    def close_all() -> None:
        ctx.interrupted = True
        for endpoint in list(endpoints.values()):
            endpoint.close()  # remote probes die on their next write; local ones are killed

    run_lanes(specs, work, close_all)
    return results


def _shared_memory(ctx: _Context, specs: list[DeviceSpec], results: dict[str, DeviceProfile]) -> dict[str, DeviceProfile]:
    """Devices on one machine share its memory (sanity.share_machine_memory): the `local:` devices
    (this machine), and `host:` devices reached at the same address that report the same hostname."""
    machine_of = {}
    for spec in specs:
        device = results.get(spec.name)
        if device is None or device.measurement is None:
            continue
        machine_of[spec.name] = "this machine" if spec.local else f"{spec.host} ({device.measurement.hostname})"
    shared, notes = share_machine_memory(list(results.values()), machine_of)
    ctx.run.notes.extend(notes)
    return {d.name: d for d in shared}


def _fail(ctx: _Context, name: str, reason: str) -> None:
    with ctx.lock:
        ctx.run.failures[name] = reason
    if not ctx.interrupted:  # after Ctrl-C the probes die because we killed them: not news
        ctx.observer.device_failed(name, reason)


def _profile_device(ctx: _Context, spec: DeviceSpec, endpoint) -> DeviceProfile:
    name, observer = spec.name, ctx.observer
    prepare(spec, endpoint, wheel=ctx.wheel, phase=observer.device_phase)
    if ctx.code is not None:
        observer.device_phase(name, "installing --workdir")
        sent = endpoint.use_code(ctx.code)
        with ctx.lock:
            ctx.run.workdir[name] = sent
    observer.device_phase(name, "identifying")
    identity = parse.typed(_identity_record(endpoint, ctx.settings, spec.accelerator), Identity)
    check_probe_version(identity)
    host_key = endpoint.host_key() if hasattr(endpoint, "host_key") else None
    device_fingerprint = parse.fingerprint(identity, host_key)
    cache = MeasurementCache(ctx.cache_root, {
        "model": ctx.model, "model_fingerprint": ctx.model_fingerprint, "granularity": ctx.granularity,
        "hppctl": __version__, "probe": PROBE_VERSION, "device": device_fingerprint,
        "settings": ctx.settings.key()})
    if ctx.force:
        cache.clear()
    budget = spec.memory or accelerator_memory(identity) or identity.memory_limit_bytes or identity.memory_available_bytes
    repeats = ctx.settings.repeats
    todo = [b for b in ctx.grid if not cache.complete(b, repeats) and cache.skip(b, budget) is None]
    if cache.setup() is None and not todo:
        todo = [ctx.grid[0]]  # the setup record was lost: run the smallest batch again to get it back
    with ctx.lock:
        ctx.run.cached[name] = [b for b in ctx.grid if b not in todo and cache.complete(b, repeats)]
        ctx.run.measured[name] = []
    if todo:
        _run_train_probe(ctx, spec, endpoint, identity, cache, todo, budget)
    profile = _device_from_cache(ctx, spec, identity, cache, budget, device_fingerprint)
    suspect, problems = implausible_batch_sizes(profile), implausible_steps(profile)
    if suspect and todo and not ctx.interrupted:
        # once, these batch sizes only, and only in a run that measured (times from the cache were
        # measured again when they were taken): a burst of other work is the usual cause
        observer.device_phase(name, f"implausible times at batch sizes {', '.join(map(str, suspect))}: measuring again")
        for b in suspect:
            cache.forget_passes(b)
        _run_train_probe(ctx, spec, endpoint, identity, cache, suspect, budget)
        profile = _device_from_cache(ctx, spec, identity, cache, budget, device_fingerprint)
        with ctx.lock:
            ctx.run.notes.append(f"{name}: batch sizes {', '.join(map(str, suspect))} measured again "
                                 f"({'; '.join(problems)})")
    return _marked_if_implausible(profile)


def check_probe_version(identity: Identity) -> None:
    """`DeviceFailure` unless the device's probe measures as this one does (PROBE_VERSION): fleet.prepare
    compares hppctl versions, but another checkout or an older wheel of the same version would
    measure otherwise (e.g. without the weight gradients), and its records would be cached under
    this version's key."""
    if identity.probe_version != PROBE_VERSION:
        theirs = identity.probe_version or "4 or older"  # 5 is the first to report it
        raise DeviceFailure(f"the device's hppctl {identity.hppctl} measures with probe version {theirs}, this one "
                            f"with {PROBE_VERSION}: other code under the same version (run with --install to put "
                            f"this one there)")


def _marked_if_implausible(profile: DeviceProfile) -> DeviceProfile:
    """The profile with its timing warning (sanity.py) among its measurement notes, if it has one."""
    warning = timing_warning(profile)
    if warning is None or profile.measurement is None:
        return profile
    info = profile.measurement
    return profile.model_copy(update={"measurement": info.model_copy(update={"notes": [*info.notes, warning]})})


def _user_modules(ctx: _Context) -> tuple[str, ...]:
    """The user modules the train probe imports first (a model of the workdir)."""
    return ctx.code.modules if ctx.code is not None else ()


def accelerator_memory(identity: Identity) -> int | None:
    """A CUDA device's memory for the probe's "would this batch fit" check (parse.memory_budget has
    the budget the planner gets; unified memory counts there as min(GPU-visible, host))."""
    gpu = identity.accelerator
    return gpu.memory_bytes if gpu is not None and gpu.type == "cuda" else None


def _identity_record(endpoint, settings: ProbeSettings, accelerator: str = "cpu") -> dict[str, Any]:
    args: dict[str, Any] = {"threads": settings.threads}
    if accelerator != "cpu":  # a CPU device's probe arguments as before
        args["accelerator"] = accelerator
    found = endpoint.probe("identify", args, timeout=120)
    record = parse.first(found, "identity")
    if record is None:
        raise DeviceFailure("the identify probe printed no identity")
    return record


def _run_train_probe(ctx: _Context, spec: DeviceSpec, endpoint, identity: Identity, cache: MeasurementCache,
                     todo: list[int], budget: int | None) -> None:
    name, observer, settings = spec.name, ctx.observer, ctx.settings
    passes = {b: max(0, settings.repeats - len(cache.passes(b))) for b in todo}
    weight = {b: 1.0 + b for b in todo}  # work per pass ~ a fixed part plus one per sample
    total = sum(weight[b] * (settings.warmup + passes[b] + 1) for b in todo)
    state = {"work": 0.0}

    def advance(b: int, text: str) -> None:
        state["work"] += weight.get(b, 0.0)
        observer.device_phase(name, text, state["work"], total)

    def on_record(record: dict[str, Any]) -> None:
        kind, b = record.get("type"), record.get("batch_size")
        if kind == "setup":
            cache.store_setup(record)
            observer.device_phase(name, f"built {record.get('layers')} layers in {record.get('setup_s', 0):.1f} s",
                                  state["work"], total)
        elif kind == "memory":
            cache.store_memory(record)
            advance(b, f"batch {b}: peak {record['peak_bytes'] / 1e6:.0f} MB")
        elif kind == "pass":
            cache.add_pass(record)
            if cache.complete(b, settings.repeats):
                with ctx.lock:
                    if b not in ctx.run.measured[name]:  # a batch size measured again (implausible times) counts once
                        ctx.run.measured[name].append(b)
        elif kind == "skip":
            cache.store_skip(b, record["reason"], budget)
            state["work"] += weight.get(b, 0.0) * (settings.warmup + passes.get(b, 0) + 1)
        elif kind == "progress" and record.get("phase") != "memory":
            advance(b, f"batch {b}: {record['phase']}")

    observer.device_phase(name, f"starting the probe ({len(todo)} batch sizes)", 0, total)
    args = {"model": ctx.model, "model_input": _model_input(ctx.model), "granularity": ctx.granularity,
            "batch_sizes": todo,
            "passes": {str(b): n for b, n in passes.items()}, "threads": identity.threads,
            "repeats": settings.repeats, "warmup": settings.warmup, "window_s": settings.window_s,
            "memory_budget_bytes": budget, **({"accelerator": spec.accelerator} if spec.accelerator != "cpu" else {})}
    try:
        endpoint.probe("train", args, on_record=on_record, timeout=settings.timeout_s, imports=_user_modules(ctx))
    except DeviceFailure as e:
        killed_at = _killed_in_memory_phase(e)
        if killed_at is None or killed_at == min(todo) and not any(cache.memory(b) for b in ctx.grid):
            raise
        # The kernel killed the probe while it tried one step at `killed_at` (out of memory): keep the
        # smaller batch sizes and measure them again without it.
        for b in ctx.grid:
            if b >= killed_at:
                cache.store_skip(b, f"killed at batch {killed_at}: {e.reason}", budget)
        with ctx.lock:
            ctx.run.notes.append(f"{name}: {e.reason}; measuring the batch sizes below {killed_at} only")
        smaller = [b for b in todo if b < killed_at]
        if smaller:
            _run_train_probe(ctx, spec, endpoint, identity, cache, smaller, budget)


def _killed_in_memory_phase(failure: DeviceFailure) -> int | None:
    if "killed" not in failure.reason:
        return None
    progress = parse.last_progress(failure.records)
    if progress and progress.get("phase") == "memory" and progress.get("batch_size"):
        return int(progress["batch_size"])
    return None


def _device_from_cache(ctx: _Context, spec: DeviceSpec, identity: Identity, cache: MeasurementCache,
                       budget: int | None, device_fingerprint: str) -> DeviceProfile:
    setup_record = cache.setup()
    if setup_record is None:
        raise DeviceFailure("the training probe printed no setup record")
    setup = parse.typed(setup_record, parse.Setup)
    if setup.layers != len(ctx.layers):
        raise DeviceFailure(f"the device cuts {ctx.model} into {setup.layers} layers, this machine into "
                            f"{len(ctx.layers)} (different torch/transformers versions?)")
    if setup.model_fingerprint and ctx.model_fingerprint and setup.model_fingerprint != ctx.model_fingerprint:
        from hppctl.zoo.user import is_user_ref
        why = ("its source differs there (edited during the run, or another copy on the device's import path)"
               if is_user_ref(ctx.model) else "different transformers versions?")
        raise DeviceFailure(f"the device builds a different {ctx.model} (model fingerprint {setup.model_fingerprint}, "
                            f"here {ctx.model_fingerprint}): {why}")
    repeats = ctx.settings.repeats
    batches = [parse.assemble_batch(setup, parse.typed(cache.memory(b), Memory),
                                    [parse.typed(p, Pass) for p in cache.passes(b)[:repeats]])
               for b in ctx.grid if cache.complete(b, repeats)]
    skipped = [(b, r["reason"]) for b in ctx.grid
               if not cache.complete(b, repeats) and (r := cache.skip(b, budget))]
    unfinished = [b for b in ctx.grid if not cache.complete(b, repeats) and not cache.skip(b, budget)]
    if unfinished:
        raise DeviceFailure(f"the training probe ended without measuring batch sizes {unfinished}")
    if not batches:
        reason = skipped[0][1] if skipped else "no batch size could be measured"
        raise DeviceFailure(f"out of memory: {reason}" if skipped else reason)
    notes = [f"batch sizes {', '.join(str(b) for b, _ in skipped)} left out: {skipped[0][1]}"] if skipped else []
    profile = parse.device_profile(spec.name, identity, setup, batches, memory_bytes=spec.memory,
                                   repeats=ctx.settings.repeats, warmup=ctx.settings.warmup, notes=notes,
                                   device_fingerprint=device_fingerprint)
    ctx.observer.device_done(spec.name, _summary(profile))
    return profile


def _summary(profile: DeviceProfile) -> str:
    b = profile.batch_sizes[-1]
    total = sum(f[-1] + bw[-1] for f, bw in zip(profile.forward_s, profile.backward_s))
    return f"{total * 1e3 / b:.2f} ms/sample at batch {b}"


def _preset_device(spec: DeviceSpec, preset, ctx: _Context) -> DeviceProfile:
    device = preset_device_profile(spec.name, preset, ctx.layers, list(ctx.grid), memory_bytes=spec.memory,
                                   parts=ctx.parts)
    return device.model_copy(update={"source": "preset"})


# ---------------------------------------------------------------------------------------------
# links
# ---------------------------------------------------------------------------------------------


def _measure_links(ctx: _Context, names: list[str], endpoints: dict[str, Any]) -> list[LinkProfile]:
    links = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ctx.observer.link(a, b, "measuring")
            try:
                link = measure_link(endpoints[a], endpoints[b], ctx.settings)
            except DeviceFailure as e:
                with ctx.lock:
                    ctx.run.failures[f"{a}-{b} link"] = e.reason
                ctx.observer.link(a, b, f"failed: {e.reason}")
                continue
            links.append(link)
            ctx.observer.link(a, b, link_text(link))
    return links


# ---------------------------------------------------------------------------------------------
# the profile
# ---------------------------------------------------------------------------------------------


def _assemble(ctx: _Context, devices: list[DeviceProfile], links: list[LinkProfile],
              optimizer_state_factor: float) -> Profile:
    present = {d.name for d in devices}
    missing = [MissingDevice(name=d.name, reason=ctx.run.failures[d.name])
               for d in ctx.cluster.devices if d.name not in present and d.name in ctx.run.failures]
    any_measured = any(d.source == "measured" for d in devices)
    return Profile(
        source="measured" if any_measured else "preset", cluster=ctx.cluster.name, model=ctx.model,
        granularity=ctx.granularity, optimizer_state_factor=float(optimizer_state_factor), layers=ctx.layers,
        devices=devices, default_bytes_per_s=ctx.cluster.bandwidth,
        links=[l for l in links if set(l.between) <= present], missing_devices=missing,
    )
