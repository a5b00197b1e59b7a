"""What `hppctl profile --json` prints after writing a profile, and the one line naming what failed.

Pure: reads a `Profile`, imports no torch.
"""

from __future__ import annotations

from pathlib import Path

from hppctl.models.profile import Profile


def failure_line(failures: dict[str, str], out: Path | None) -> str:
    """One line naming every device (and link) that failed, with its reason."""
    devices = {k: v for k, v in failures.items() if not k.endswith(" link")}
    links = {k: v for k, v in failures.items() if k.endswith(" link")}
    parts = []
    if devices:
        noun = "device" if len(devices) == 1 else "devices"
        parts.append(f"{len(devices)} {noun} could not be profiled: " + "; ".join(f"{k}: {v}" for k, v in devices.items()))
    if links:
        parts.append("; ".join(f"{k}: {v} (the inventory's bandwidth is used)" for k, v in links.items()))
    written = f" (wrote {out} without {'it' if len(devices) == 1 else 'them'})" if out is not None and devices else ""
    return "; ".join(parts) + written


def _per_sample_train_s(profile: Profile, device_index: int, batch_index: int) -> float:
    d = profile.devices[device_index]
    b = d.batch_sizes[batch_index]
    return sum(f[batch_index] + bw[batch_index] for f, bw in zip(d.forward_s, d.backward_s)) / b


def summarize(profile: Profile, out: Path | None) -> dict:
    """What `--json` prints after writing: where, what, and each device's training speed."""
    devices = []
    for i, d in enumerate(profile.devices):
        entry = {
            "name": d.name, "kind": d.kind, "source": d.source or profile.source, "memory_bytes": d.memory_bytes,
            "peak_flops": d.peak_flops, "batch_sizes": d.batch_sizes,
            "train_s_per_sample": {str(b): _per_sample_train_s(profile, i, j) for j, b in enumerate(d.batch_sizes)},
        }
        if d.measurement is not None:
            entry.update(cpu_quota_cores=d.measurement.cpu_quota_cores, threads=d.measurement.threads,
                         train_step_s=dict(zip(map(str, d.batch_sizes), d.train_step_s or [])),
                         train_peak_bytes=dict(zip(map(str, d.batch_sizes), d.train_peak_bytes or [])))
        devices.append(entry)
    return {
        "out": str(out) if out is not None else None, "source": profile.source, "cluster": profile.cluster,
        "model": profile.model, "granularity": profile.granularity, "layers": len(profile.layers),
        "parameters_bytes": sum(l.param_bytes for l in profile.layers),
        "forward_flops_per_sample": sum(l.forward_flops_per_sample for l in profile.layers),
        "batch_sizes": profile.devices[0].batch_sizes, "optimizer_state_factor": profile.optimizer_state_factor,
        "default_bytes_per_s": profile.default_bytes_per_s,
        "links": [{"between": l.between, "bytes_per_s": l.bytes_per_s, "directed_bytes_per_s": l.directed_bytes_per_s,
                   "rtt_s": l.rtt_s, "source": l.source} for l in profile.links],
        "missing_devices": [m.model_dump(mode="json") for m in profile.missing_devices],
        "digest": profile.digest(), "devices": devices,
    }
