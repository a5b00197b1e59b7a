"""What workers report to their launcher through the run's store (`runtime/wire.py`): typed and
versioned, written with `model_dump_json` and read with `model_validate_json`, so that a report with
a missing field, a wrong type or another build's version is refused where it is read (the device's
failure, one line) instead of surfacing as a KeyError in the launcher.

- `RoundReport`: `metrics/<round>/<device>` of a training worker (HPP, Bi-Partition, nf1b, pipedream),
  with the fault-tolerant worker's fields (`generation`, backups, the reconfiguration's phases);
- `PslRoundReport`: `metrics/<round>/<device>` of a PSL client or helper;
- `Inventory`: `stall/<generation>/<device>`, what a fault-tolerant worker can restore after a loss
  (ft/replay.py chooses the resume round and sizes the transfers from it).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from hppctl.models.base import FrozenModel
from hppctl.models.events import NonNegFloat, NonNegInt

REPORT_VERSION = 1
NAN_SAFE = ConfigDict(ser_json_inf_nan="constants")
"""A diverged round's loss is NaN or infinite: written as such (not null), so the launcher reads the
number and stops the run as diverged (runtime/divergence.py, exit 4)."""
MEMORY_FIELDS = ("rss_bytes", "peak_rss_bytes", "baseline_rss_bytes", "host", "cgroup")


class ProcessFigures(FrozenModel):
    """The worker process's memory and where it runs, as every round report carries them."""

    model_config = NAN_SAFE

    rss_bytes: NonNegInt
    peak_rss_bytes: NonNegInt
    host: str
    cgroup: str

    def memory(self) -> dict[str, Any]:
        """What a run's result keeps of a device's last report (`RunResult.workers`, the summary's `memory`)."""
        return {k: getattr(self, k) for k in MEMORY_FIELDS if hasattr(self, k)}  # PSL reports have no baseline


class Span(FrozenModel):
    """One timed step of a traced round (`--trace`): seconds from the round's start."""

    name: str
    category: str
    track: str
    """A device, a link `src->dst`, or a device's `allreduce_lane`."""
    start_s: float
    duration_s: NonNegFloat
    args: dict[str, Any] = {}


LANE_SUFFIX = " allreduce"


def allreduce_lane(device: str) -> str:
    """The track of a device's gradient buckets in flight: a thread of its own under the device's
    in a trace, since the buckets overlap the device's last backward (runtime/reducer.py)."""
    return device + LANE_SUFFIX


class RoundReport(ProcessFigures):
    """A training worker's round: its times, traffic, loss share and memory (runtime/metrics.py turns
    the round's reports into its metrics row)."""

    version: Literal[1] = REPORT_VERSION
    round: NonNegInt
    device: str
    stage: NonNegInt
    started_at: float
    """Wall-clock time (time.time()) at the start of the round."""
    duration_s: NonNegFloat
    compute_s: NonNegFloat
    wait_s: NonNegFloat
    allreduce_s: NonNegFloat
    step_s: NonNegFloat
    cpu_s: NonNegFloat
    """CPU seconds of the whole worker process over the round (all threads)."""
    bytes_sent: NonNegInt
    loss: float
    """Tail stage: this device's share of the mean loss over the global batch (0 elsewhere)."""
    correct: NonNegInt
    samples: NonNegInt
    baseline_rss_bytes: NonNegInt
    lr: float
    spans: list[Span] = []
    """Only with `--trace`."""
    generation: NonNegInt = 0
    """Fault tolerance: the layout generation the round ran in."""
    backup_bytes: NonNegInt = 0
    backup_s: NonNegFloat = 0.0
    recovery_phases: dict[str, float] = {}
    """Fault tolerance, the first round after a re-plan: seconds per step of the reconfiguration."""


class ClientBatch(FrozenModel):
    """A PSL client's batch as run (runtime/psl/roles.py): seconds from the batch's start."""

    model_config = NAN_SAFE

    step: NonNegInt
    started_at: float = 0.0
    """Wall-clock time (time.time()) of the batch's start, which the other times count from."""
    completion_s: float
    sent_s: float
    activations_s: float
    gradients_sent_s: float
    gradients_s: float
    loss: float
    correct: NonNegInt


class HelperBatch(FrozenModel):
    """A PSL helper's batch: its tasks [kind, client, start_s, end_s, ready_s] in the order run."""

    step: NonNegInt
    started_at: float = 0.0
    """Wall-clock time (time.time()) of the batch's start, which the tasks' times count from."""
    tasks: list[tuple[str, str, float, float, float]]


class PslRoundReport(ProcessFigures):
    """A PSL client's or helper's round: its batches and FedAvg time."""

    version: Literal[1] = REPORT_VERSION
    round: NonNegInt
    device: str
    role: Literal["client", "helper"]
    started_at: float
    duration_s: NonNegFloat
    cpu_s: NonNegFloat
    fedavg_s: NonNegFloat
    batches: list[ClientBatch] | list[HelperBatch]


class StateSizes(FrozenModel):
    """Bytes of every state name a worker holds, by round (a string: JSON object keys): its own
    snapshots, and per device the backups it holds (`replication.state_bytes`)."""

    own: dict[str, dict[str, NonNegInt]]
    backups: dict[str, dict[str, dict[str, NonNegInt]]]


class Inventory(FrozenModel):
    """`stall/<generation>/<device>`: the rounds a worker can restore in layout `layout` (its snapshots,
    and per device the backups it holds), their sizes, and what it still keeps of the layout before
    (`previous`) until its first round in the new one."""

    version: Literal[1] = REPORT_VERSION
    layout: NonNegInt = 0
    snapshots: list[NonNegInt]
    backups: dict[str, list[NonNegInt]] = {}
    state_bytes: StateSizes = Field(default_factory=lambda: StateSizes(own={}, backups={}))
    previous: Inventory | None = None
