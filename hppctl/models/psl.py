"""Parallel split learning (PSL): the spec a user writes and the plan `hppctl psl plan` writes.

Many data-owning *clients* each run part 1 (layers `[0, σ1)`) and part 3 (`[σ2, L)`) of the
model; a few *helpers* each hold one copy of part 2 (`[σ1, σ2)`) per assigned client and serve
its forward (F) and backward (B) tasks. Cuts are layer boundaries, so the three parts are the
half-open ranges the rest of hppctl uses. Paper: seeds/002 (Tirana et al., INFOCOM'24);
formulas and choices in docs/psl.md.

Times are per (helper i, client j) pair, in seconds, indexed `[helper][client]`, with the
paper's names: r (client part-1 forward + upload: the F task's release), p (helper part-2
forward), l (download + part-3 forward + loss), l′ (part-3 backward + upload of gradients),
p′ (helper part-2 backward), r′ (download + part-1 backward: the client's tail).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from hppctl.limits import MAX_BATCH_SAMPLES, MAX_PSL_CLIENTS, MAX_PSL_HELPERS, MAX_PSL_PAIRS, MIN_PSL_SLOT_S
from hppctl.models.base import FrozenModel, duplicates, listed
from hppctl.models.cluster import ClusterSpec, DeviceName, DeviceSpec, LinkSpec
from hppctl.models.profile import Granularity
from hppctl.models.units import Bytes, BytesPerSecond, Seconds

PosInt = Annotated[int, Field(gt=0)]
BatchSamples = Annotated[int, Field(gt=0, le=MAX_BATCH_SAMPLES)]
NonNegInt = Annotated[int, Field(ge=0)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]


def _ordered(cut: list[int]) -> list[int]:
    if cut[0] >= cut[1]:
        raise ValueError(f"σ1 must be below σ2, got {cut}")
    return cut


Cut = Annotated[list[PosInt], Field(min_length=2, max_length=2), AfterValidator(_ordered)]
"""[σ1, σ2]: part 1 is layers [0, σ1), part 2 [σ1, σ2), part 3 [σ2, L); 0 < σ1 < σ2 < L."""
Matrix = list[list[NonNegFloat]]

METHODS = ("auto", "balanced-greedy", "admm", "exact", "random-fcfs")
OPTIMIZERS = {"sgd": 0.0, "momentum": 1.0, "adam": 2.0}
"""Optimizer state in units of the parameter bytes (as `Profile.optimizer_state_factor`)."""


# ---------------------------------------------------------------------------------------------
# The spec (`hppctl psl plan --spec psl.yaml`)
# ---------------------------------------------------------------------------------------------


class PslDeviceSpec(FrozenModel):
    """A client or helper modelled by a device preset; `count` > 1 expands to `name0`, `name1`, …"""

    name: DeviceName
    preset: str
    count: Annotated[int, Field(gt=0, le=MAX_PSL_CLIENTS)] = 1
    """Checked before any name is made: `count: 1000000` expanded a million names and then hung."""
    memory: Bytes | None = None
    """Training memory budget (default: the preset's)."""
    bandwidth: BytesPerSecond | None = None
    """Clients only: this client's link to every helper (default: the spec's `bandwidth`)."""
    cut: Cut | None = None
    """Clients only: this client's cut layers (default: the spec's `cut`)."""

    def names(self) -> list[str]:
        return [self.name] if self.count == 1 else [f"{self.name}{k}" for k in range(self.count)]


class PslSpec(FrozenModel):
    """Clients, helpers, the model and its cut: everything `hppctl psl plan` needs. See docs/psl.md."""

    format_version: Literal[1] = 1
    name: DeviceName
    model: str
    """Built-in model (`hppctl models`)."""
    granularity: Granularity = "block"
    cut: Cut
    batch: BatchSamples = 32
    """Samples per batch (each client's batch update)."""
    optimizer: Literal["sgd", "momentum", "adam"] = "momentum"
    bandwidth: BytesPerSecond = 12.5e6
    """Default client-helper bandwidth (100mbit)."""
    slot: Seconds | Literal["auto"] = "auto"
    """Slot length of the time-indexed solvers (admm, exact); `auto` sizes it to the instance."""
    clients: Annotated[list[PslDeviceSpec], Field(min_length=1)]
    helpers: Annotated[list[PslDeviceSpec], Field(min_length=1)]
    links: list[LinkSpec] = []
    """Per client-helper pair overrides of the bandwidth."""

    @field_validator("slot")
    @classmethod
    def _slot_not_absurdly_short(cls, value: float | str) -> float | str:
        if isinstance(value, float) and value < MIN_PSL_SLOT_S:
            raise ValueError(f"slot must be at least {MIN_PSL_SLOT_S:g} s (docs/formats.md, Limits), got {value:g} s")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "PslSpec":
        for k, h in enumerate(self.helpers):
            if h.cut is not None or h.bandwidth is not None:
                raise ValueError(f"helpers.{k}: `cut` and `bandwidth` belong to clients (helper {h.name!r})")
        check_psl_size(sum(c.count for c in self.clients), sum(h.count for h in self.helpers))  # before expanding
        dupes = duplicates(self.client_names() + self.helper_names())
        if dupes:
            raise ValueError(f"duplicate device names: {listed(dupes)}")
        clients, helpers = set(self.client_names()), set(self.helper_names())
        for k, link in enumerate(self.links):
            a, b = link.between
            if not ({a, b} & clients and {a, b} & helpers):
                raise ValueError(f"links.{k}: must join a client and a helper, got {link.between}")
        return self

    def client_names(self) -> list[str]:
        return [n for c in self.clients for n in c.names()]

    def helper_names(self) -> list[str]:
        return [n for h in self.helpers for n in h.names()]

    def client_cuts(self) -> list[list[int]]:
        return [list(c.cut or self.cut) for c in self.clients for _ in c.names()]

    def cluster_spec(self) -> ClusterSpec:
        """Clients and helpers as a preset cluster (each client's bandwidth as per-pair links)."""
        devices = [DeviceSpec(name=n, preset=d.preset, memory=d.memory)
                   for d in (*self.clients, *self.helpers) for n in d.names()]
        links = [LinkSpec(between=[n, h], bandwidth=c.bandwidth)
                 for c in self.clients if c.bandwidth is not None for n in c.names() for h in self.helper_names()]
        return ClusterSpec(name=self.name, bandwidth=self.bandwidth, devices=devices, links=links + list(self.links))

    def request(self) -> "PslRequest":
        return PslRequest(clients=self.client_names(), helpers=self.helper_names(), cuts=self.client_cuts(),
                          batch=self.batch)


def check_psl_size(clients: int, helpers: int) -> None:
    """Refuse an instance beyond the PSL limits (docs/formats.md, Limits) with a ValueError."""
    for what, count, most in (("clients", clients, MAX_PSL_CLIENTS), ("helpers", helpers, MAX_PSL_HELPERS),
                              ("helpers x clients", clients * helpers, MAX_PSL_PAIRS)):
        if count > most:
            raise ValueError(f"{count} {what}, more than the limit of {most} (docs/formats.md, Limits)")


class PslRequest(FrozenModel):
    """What to plan: which profile devices are clients and helpers, their cuts, the batch."""

    clients: Annotated[list[DeviceName], Field(min_length=1)]
    helpers: Annotated[list[DeviceName], Field(min_length=1)]
    cuts: list[Cut]
    """Per client, aligned with `clients`."""
    batch: BatchSamples

    @model_validator(mode="after")
    def _consistent(self) -> "PslRequest":
        if len(self.cuts) != len(self.clients):
            raise ValueError(f"cuts has {len(self.cuts)} entries for {len(self.clients)} clients")
        check_psl_size(len(self.clients), len(self.helpers))
        both = sorted(set(self.clients) & set(self.helpers))
        if both:
            raise ValueError(f"device(s) {listed(both)} are both client and helper")
        for name, group in (("clients", self.clients), ("helpers", self.helpers)):
            dupes = duplicates(group)
            if dupes:
                raise ValueError(f"{name}: duplicate names {listed(dupes)}")
        return self


# ---------------------------------------------------------------------------------------------
# The plan (`kind: psl`)
# ---------------------------------------------------------------------------------------------


class PslTimes(FrozenModel):
    """The instance the solvers see: six per-pair times `[helper][client]` in seconds, and memory."""

    r_s: Matrix
    p_s: Matrix
    l_s: Matrix
    l_prime_s: Matrix
    p_prime_s: Matrix
    r_prime_s: Matrix
    demand_bytes: list[PosInt]
    """d_j: helper memory one client's part-2 copy needs (weights, gradients, optimizer state, one batch)."""
    capacity_bytes: list[PosInt]
    """m_i: each helper's memory budget."""

    @model_validator(mode="after")
    def _shapes(self) -> "PslTimes":
        helpers, clients = len(self.capacity_bytes), len(self.demand_bytes)
        for field in ("r_s", "p_s", "l_s", "l_prime_s", "p_prime_s", "r_prime_s"):
            rows = getattr(self, field)
            if len(rows) != helpers or any(len(row) != clients for row in rows):
                raise ValueError(f"{field} must be {helpers} helpers x {clients} clients")
            if any(not math.isfinite(v) for row in rows for v in row):
                raise ValueError(f"{field} has a non-finite time")
        if any(v <= 0 for row in self.p_s for v in row) or any(v <= 0 for row in self.p_prime_s for v in row):
            raise ValueError("helper task times p and p′ must be positive")
        return self

    @property
    def num_helpers(self) -> int:
        return len(self.capacity_bytes)

    @property
    def num_clients(self) -> int:
        return len(self.demand_bytes)


class PslPiece(FrozenModel):
    """A stretch of one task on a helper: `fraction` of its work, planned over [start_s, end_s)."""

    kind: Literal["F", "B"]
    client: DeviceName
    fraction: Annotated[float, Field(gt=0, le=1)]
    start_s: NonNegFloat
    end_s: NonNegFloat

    def __str__(self) -> str:
        share = "" if self.fraction == 1 else f"({self.fraction:.2f})"
        return f"{self.kind}:{self.client}{share}"


class PslHelperPlan(FrozenModel):
    """One helper: its clients (one part-2 copy each) and the order it serves their tasks in."""

    helper: DeviceName
    clients: list[DeviceName]
    memory_bytes: NonNegInt
    memory_budget_bytes: PosInt
    sequence: list[PslPiece]
    """Pieces in serving order. Non-preemptive plans have one piece per task; preemptive ones
    (admm, exact) split a task where the slot schedule pauses it."""


class PslClientPrediction(FrozenModel):
    client: DeviceName
    helper: DeviceName
    forward_done_s: NonNegFloat
    """When the helper finishes the client's F task."""
    completion_s: NonNegFloat
    """c_j: the client's batch update is done (its part-1 backward ends)."""
    queueing_s: NonNegFloat
    """Time the client's tasks waited at the helper: c_j minus the six times."""


class PslPrediction(FrozenModel):
    makespan_s: NonNegFloat
    """Batch makespan max_j c_j of the planned timeline (slot methods: slots x slot_s, rounded up)."""
    makespan_slots: NonNegInt | None = None
    """The time-indexed methods' objective, in slots."""
    lower_bound_s: NonNegFloat
    """max_j of the client's fastest helper-independent path (no queueing): no plan does better."""
    clients: list[PslClientPrediction]


class PslPlan(FrozenModel):
    """A parallel split learning plan. See docs/psl.md."""

    format_version: Literal[1] = 1
    kind: Literal["psl"] = "psl"
    method: Literal["balanced-greedy", "admm", "exact", "random-fcfs", "search"]
    """What produced the plan; `search` only through `auto` (its exhaustive search of small instances)."""
    requested_method: Literal["auto", "balanced-greedy", "admm", "exact", "random-fcfs"]
    model: str
    granularity: Granularity
    batch: BatchSamples
    clients: Annotated[list[DeviceName], Field(min_length=1)]
    helpers: Annotated[list[DeviceName], Field(min_length=1)]
    cuts: list[Cut]
    """Per client, aligned with `clients`."""
    assignment: list[DeviceName]
    """Helper of each client, aligned with `clients`."""
    times: PslTimes
    slot_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    """Slot length the time-indexed methods solved with (None for FCFS methods)."""
    helper_plans: list[PslHelperPlan]
    prediction: PslPrediction
    solver_time_s: NonNegFloat
    notes: list[str] = []

    @model_validator(mode="after")
    def _consistent(self) -> "PslPlan":
        J, I = len(self.clients), len(self.helpers)
        check_psl_size(J, I)
        if (self.times.num_clients, self.times.num_helpers) != (J, I):
            raise ValueError(f"times are for {self.times.num_helpers} helpers x {self.times.num_clients} clients, "
                             f"plan has {I} x {J}")
        for field in ("cuts", "assignment"):
            if len(getattr(self, field)) != J:
                raise ValueError(f"{field} has {len(getattr(self, field))} entries for {J} clients")
        unknown = sorted(set(self.assignment) - set(self.helpers))
        if unknown:
            raise ValueError(f"assignment names unknown helper(s) {unknown}")
        if [h.helper for h in self.helper_plans] != self.helpers:
            raise ValueError("helper_plans must list every helper once, in the order of `helpers`")
        for h in self.helper_plans:
            _check_helper(h, [c for c, a in zip(self.clients, self.assignment) if a == h.helper])
        return self


def _check_helper(h: PslHelperPlan, clients: list[str]) -> None:
    """Clients match the assignment; each task's pieces add up to one; F before B; memory fits."""
    if sorted(h.clients) != sorted(clients):
        raise ValueError(f"helper {h.helper}: clients {h.clients} differ from the assignment's {clients}")
    if h.memory_bytes > h.memory_budget_bytes:
        raise ValueError(f"helper {h.helper}: memory {h.memory_bytes} exceeds its budget {h.memory_budget_bytes}")
    done: dict[tuple[str, str], float] = {}
    assigned = set(clients)  # a set: a helper may serve thousands of clients
    for k, piece in enumerate(h.sequence):
        if piece.client not in assigned:
            raise ValueError(f"helper {h.helper}: sequence.{k} serves client {piece.client!r}, not assigned here")
        if piece.kind == "B" and done.get(("F", piece.client), 0.0) < 1 - 1e-6:
            raise ValueError(f"helper {h.helper}: sequence.{k} runs B:{piece.client} before its F task is done")
        done[(piece.kind, piece.client)] = done.get((piece.kind, piece.client), 0.0) + piece.fraction
    for c in clients:
        for kind in ("F", "B"):
            if abs(done.get((kind, c), 0.0) - 1) > 1e-6:
                raise ValueError(f"helper {h.helper}: {kind}:{c} pieces add up to {done.get((kind, c), 0.0):g}, not 1")
