"""The plans the planner gave before its speed-up (issue 28 item 4), so the faster code can be held to them.

`instances()` rebuilds every profile and request from its parameters: the planner tests' own
instances (test_asteroid.py's exhaustive-search, coverage, baseline and pruning cases, the example
profile) and 40 seeded medium ones (20-80 layers x 3-8 devices, memory budgets that bind on some),
plus two above `FINE_SECOND_ORDER_LAYERS` so the coarse second device order is exercised.
`plans_of(instance)` is what the fixture stores for each: per strategy, the stages (layers, devices,
samples), the round latency as `float.hex` (equal to the last bit) and the dominant step; for the
test_asteroid DP cases also the paper DP's own `best(devices=N)`.

Recorded on the code before the change, and again with the AllReduce overlap in the cost model
(see test_plans_unchanged.py for what was checked first), with:

    PYTHONPATH=. python -m tests.planner.plan_fixture    # writes tests/planner/plans_before_scale.json
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from hppctl.models.plan import PlanRequest
from hppctl.models.profile import Profile
from hppctl.planner import STRATEGIES, cost_model, make_plan
from hppctl.planner.asteroid import AsteroidDP, memory_order
from hppctl.errors import Infeasible
from hppctl.store import load
from tests.conftest import make_profile

FIXTURE = Path(__file__).with_name("plans_before_scale.json")
ROOT = Path(__file__).resolve().parents[2]
TRAINING = [name for name in STRATEGIES]
HPP = ["asteroid", "asteroid-paper", "dp", "pp", "pipedream", "dapple"]


@dataclass
class Instance:
    name: str
    profile: Profile
    request: PlanRequest
    strategies: list[str]
    paper_dp: bool = False


def exhaustive_case(seed: int) -> Instance:
    """test_asteroid.small_instance, rebuilt here so the fixture does not import a test module."""
    rng = random.Random(seed)
    n = rng.randint(1, 3 if seed % 4 else 4)
    layers = rng.randint(1, 5 if n == 4 else 6)
    profile = make_profile(layers=layers, speeds=[rng.uniform(0.3, 3) for _ in range(n)],
                           memory_gb=[rng.choice([0.05, 0.2, 1.0]) for _ in range(n)], seed=seed,
                           activation_scale=rng.choice([1, 20, 100]), param_scale=rng.choice([1, 50]))
    request = PlanRequest(global_batch=6 * rng.choice([1, 2, 4]), micro_batch=6)
    return Instance(f"exhaustive-{seed}", profile, request, TRAINING, paper_dp=True)


def coverage_case(seed: int) -> Instance:
    rng = random.Random(100 + seed)
    profile = make_profile(layers=rng.randint(4, 20), speeds=[rng.uniform(0.5, 3) for _ in range(rng.randint(2, 6))],
                           seed=seed, activation_scale=rng.choice([1, 30]))
    return Instance(f"coverage-{seed}", profile, PlanRequest(global_batch=256, micro_batch=rng.choice([16, 32, 64])),
                    TRAINING)


def pruning_case(seed: int) -> Instance:
    rng = random.Random(500 + seed)
    n = rng.randint(2, 6)
    profile = make_profile(layers=rng.randint(5, 40), speeds=[rng.uniform(0.3, 3) for _ in range(n)],
                           memory_gb=[rng.choice([0.1, 0.5, 4]) for _ in range(n)], seed=seed,
                           activation_scale=rng.choice([1, 30]), param_scale=rng.choice([1, 30]))
    return Instance(f"pruning-{seed}", profile, PlanRequest(global_batch=512, micro_batch=rng.choice([16, 64])),
                    HPP, paper_dp=True)


def medium_case(seed: int) -> Instance:
    """20-80 layers x 3-8 devices; budgets from roomy to binding, micro-batches 16-128."""
    rng = random.Random(9000 + seed)
    n = rng.randint(3, 8)
    profile = make_profile(layers=rng.randint(20, 80), speeds=[rng.uniform(0.3, 4) for _ in range(n)],
                           memory_gb=[rng.choice([0.3, 1, 2, 4, 8]) for _ in range(n)], seed=seed,
                           activation_scale=rng.choice([1, 5, 20]), param_scale=rng.choice([1, 10]),
                           grid=rng.choice([None, [1, 2, 4, 8, 16, 32, 64], [1, 8, 32, 128]]))
    micro_batch = rng.choice([16, 32, 64, 96, 128])
    request = PlanRequest(global_batch=micro_batch * rng.choice([1, 4, 8, 16, 32]), micro_batch=micro_batch)
    return Instance(f"medium-{seed}", profile, request, HPP, paper_dp=True)


def deep_case(seed: int) -> Instance:
    """More layers than FINE_SECOND_ORDER_LAYERS: `asteroid`'s second order runs on super-layers."""
    rng = random.Random(7000 + seed)
    n = rng.randint(3, 5)
    profile = make_profile(layers=rng.randint(410, 450), speeds=[rng.uniform(0.5, 4) for _ in range(n)],
                           memory_gb=[rng.choice([1, 2, 4]) for _ in range(n)], seed=seed,
                           activation_scale=rng.choice([1, 3]), grid=[1, 2, 4, 8, 16, 32, 64])
    return Instance(f"deep-{seed}", profile, PlanRequest(global_batch=512, micro_batch=64), ["asteroid", "asteroid-paper"])


def instances() -> list[Instance]:
    out = [exhaustive_case(seed) for seed in range(24)]
    out += [coverage_case(seed) for seed in range(12)]
    out.append(Instance("baselines-40x6", make_profile(layers=40, speeds=(1, 1, 1, 2, 2, 3), memory_gb=(4, 4, 4, 8, 8, 8),
                                                       activation_scale=5),
                        PlanRequest(global_batch=2048, micro_batch=64), TRAINING))
    out.append(Instance("memory-blind-12x4", make_profile(layers=12, speeds=(1, 1, 1, 1), memory_gb=(4, 0.02, 0.02, 0.02),
                                                          activation_scale=40),
                        PlanRequest(global_batch=512, micro_batch=64), TRAINING))
    out += [pruning_case(seed) for seed in range(10)]
    out.append(Instance("example-tiny", load(ROOT / "profiles/example-tiny.json", Profile),
                        PlanRequest(global_batch=64, micro_batch=16), TRAINING))
    out += [medium_case(seed) for seed in range(40)]
    out += [deep_case(seed) for seed in range(2)]
    return out


def plans_of(instance: Instance) -> dict:
    """Per strategy: stages, round latency (hex) and dominant step; None where no plan fits."""
    found: dict = {}
    for name in instance.strategies:
        try:
            plan = make_plan(instance.profile, instance.request, name)
        except Infeasible:
            found[name] = None
            continue
        found[name] = {
            "stages": [{"layers": s.layers, "backward_layers": getattr(s, "backward_layers", None),
                        "devices": s.devices, "samples": s.samples} for s in plan.stages],
            "round_latency_s": plan.prediction.round_latency_s.hex(),
            "dominant_step": plan.prediction.dominant_step,
        }
    if instance.paper_dp:
        cm = cost_model(instance.profile, instance.request)
        order = memory_order(cm)
        full = AsteroidDP(cm, order).best(devices=len(order))
        found["paper-dp-unpruned"] = None if full is None else {
            "stages": [[s.start, s.end, list(s.devices), list(s.samples)] for s in full.stages],
            "latency": full.latency.hex()}
    return found


def record() -> None:
    document = {"instances": {i.name: plans_of(i) for i in instances()}}
    FIXTURE.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE} ({len(document['instances'])} instances)")


if __name__ == "__main__":
    record()
