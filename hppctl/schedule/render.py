"""A simulated round as a PNG timeline (one row per device, then one per link). Needs matplotlib.

matplotlib is optional (`pip install 'hppctl[plot]'`) and imported only inside `render_png`, so the
rest of `hppctl.schedule` stays light.
"""

from __future__ import annotations

from pathlib import Path

from hppctl.errors import BadInput
from hppctl.models.schedule import Schedule
from hppctl.schedule.simulate import SimResult
from hppctl.store import atomic_output

COLOURS = {"forward": "#4c78a8", "backward": "#59a14f", "allreduce": "#e15759", "step": "#555555",
           "activations": "#f28e2b", "gradients": "#b07aa1"}


MISSING_MATPLOTLIB = "--png needs matplotlib: pip install 'hppctl[plot]'"


def require_matplotlib() -> None:
    """Refuse `--png` before any work when matplotlib cannot be imported: a missing optional
    dependency is the user's to install (`BadInput`, exit 2), not a failure of the run."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise BadInput(MISSING_MATPLOTLIB) from None


def render_png(result: SimResult, schedule: Schedule, path: str | Path, *, title: str = "") -> None:
    """Write a Gantt chart of the round: F blue, B green, AllReduce red; transfers on link rows."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise BadInput(MISSING_MATPLOTLIB) from None
    devices = [d for s in schedule.stages for d in s.devices]
    stage_of = {d: p for p, s in enumerate(schedule.stages) for d in s.devices}
    links = sorted({sp.track for sp in result.spans if "->" in sp.track},
                   key=lambda t: (devices.index(t.split("->")[0]), devices.index(t.split("->")[1])))
    rows = devices + links
    labels = [f"s{stage_of[d]} {d}" for d in devices] + links
    index = {track: i for i, track in enumerate(rows)}
    height = max(2.5, 0.32 * len(rows) + 1.2)
    fig, ax = plt.subplots(figsize=(14, height), dpi=110)
    scale, unit = (1.0, "s") if result.round_latency_s >= 1 else (1e3, "ms")
    for sp in result.spans:
        y = index[sp.track]
        ax.broken_barh([(sp.start_s * scale, sp.duration_s * scale)], (y - 0.4, 0.8),
                       facecolors=COLOURS.get(sp.category, "#999999"), edgecolor="white", linewidth=0.3)
        if sp.category in ("forward", "backward") and sp.duration_s * scale > result.round_latency_s * scale / 90:
            ax.text((sp.start_s + sp.duration_s / 2) * scale, y, str(sp.args.get("micro_batch", "")),
                    ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, result.round_latency_s * scale * 1.01)
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="x", linewidth=0.3)
    ax.set_title(title or f"{schedule.policy}: round {result.round_latency_s:.3f} s, "
                          f"{result.throughput_samples_per_s:.1f} samples/s ({result.mode} transfers)", fontsize=9)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()], loc="upper center",
              bbox_to_anchor=(0.5, -0.12 if len(rows) > 8 else -0.25), ncol=6, fontsize=7, frameon=False)
    fig.tight_layout()
    try:  # atomic, like every file hppctl writes, and never over a device or a symlink
        with atomic_output(path) as f:
            fig.savefig(f, format="png")
    finally:
        plt.close(fig)
