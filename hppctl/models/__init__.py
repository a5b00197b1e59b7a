"""Data only: the typed, versioned contracts between hppctl's steps (no behaviour beyond validation)."""

from hppctl.models.cluster import ClusterSpec, DeviceSpec, LinkSpec, SshSpec
from hppctl.models.plan import HppPlan, MemoryViolation, Prediction, StagePlan, TransferPlan
from hppctl.models.profile import DeviceProfile, LayerCost, LinkProfile, Profile

__all__ = [
    "ClusterSpec", "DeviceSpec", "LinkSpec", "SshSpec",
    "HppPlan", "MemoryViolation", "Prediction", "StagePlan", "TransferPlan",
    "DeviceProfile", "LayerCost", "LinkProfile", "Profile",
]
