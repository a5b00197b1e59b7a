"""A tampered plan that keeps the right `profile_digest` (issue 23, item 7): `plan --plan`, `simulate`
and `run` refuse it with the same line, one shared check (planner/explain.py check_plan_matches).
Before, `plan --plan … --explain` raised IndexError/KeyError and `simulate` a ValueError traceback."""

from __future__ import annotations

import pytest

from hppctl.models.plan import HppPlan, PlanRequest
from hppctl.planner import make_plan
from hppctl.store import save
from tests.conftest import make_profile
from tests.runtime.factories import local_cluster


def tampered(plan: HppPlan, how: str) -> HppPlan:
    doc = plan.model_dump(mode="json")
    if how == "range":
        doc["stages"][-1]["layers"][1] += 3  # past the model's last layer
    else:
        doc["stages"][0]["devices"][0] = "zz9"  # a device the profile never measured
    return HppPlan.model_validate(doc)


@pytest.fixture
def setup(tmp_path):
    profile = make_profile(layers=5, speeds=(1, 2, 3)).model_copy(update={"model": "tiny-mlp"})
    save(tmp_path / "p.json", profile)
    return tmp_path, make_plan(profile, PlanRequest(global_batch=16, micro_batch=4))


@pytest.mark.parametrize("how, field, needle", [("range", "layers", "the plan covers 8 layers"),
                                                ("device", "devices.0", "device 'zz9' is not in")])
@pytest.mark.parametrize("command", ["plan", "plan --explain", "simulate", "run"])
def test_a_tampered_plan_is_refused_alike_by_every_command(cli, setup, command, how, field, needle):
    tmp, plan = setup
    bad = tampered(plan, how)
    save(tmp / "plan.yaml", bad)
    profile = tmp / "p.json"
    argv = {"plan": ["plan", "--profile", profile, "--plan", tmp / "plan.yaml"],
            "plan --explain": ["plan", "--profile", profile, "--plan", tmp / "plan.yaml", "--explain"],
            "simulate": ["simulate", "--plan", tmp / "plan.yaml", "--profile", profile],
            "run": ["run", "--plan", tmp / "plan.yaml", "--profile", profile, "--cluster", tmp / "c.yaml"]}[command]
    save(tmp / "c.yaml", local_cluster(*bad.devices()))
    code, out, err = cli(*argv)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {tmp / 'plan.yaml'}: stages.") and field in err and needle in err
    assert str(profile) in err
