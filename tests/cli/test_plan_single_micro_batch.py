"""`hppctl plan` when the global batch is one micro-batch (M = 1), for every strategy and `--compare`.

Regression (issue 24 item 5): DAPPLE's score (M - 1) * peak was 0 * inf = NaN on unreachable
states at M = 1, argmin picked it, and the broken partition crashed the shared evaluation with
`max() arg is an empty sequence`. Every strategy reached it through the infeasible-request
explanation (which consults dapple's layout), `--strategy dapple` and `--compare` even when a
plan fits. The profiles are the preset Env A / Env D ones of the issue.
"""

import json
from pathlib import Path

import pytest

from hppctl.cli import run

ROOT = Path(__file__).resolve().parents[2]
TRAINING_STRATEGIES = ["asteroid", "asteroid-paper", "dp", "pp", "pipedream", "dapple",
                       "bipartition", "bipartition-bsa", "bipartition-paper", "layerwise"]


@pytest.fixture(scope="module")
def preset_profiles(tmp_path_factory):
    """Env A + ResNet-50 (B = 256 fits no device) and Env D + MobileNetV2 (B = 128 fits)."""
    out = tmp_path_factory.mktemp("profiles")
    paths = {}
    for key, env, model in (("a-resnet50", "env-a", "resnet50"), ("d-mobilenetv2", "env-d", "mobilenetv2")):
        paths[key] = out / f"{key}.json"
        assert run(["profile", "--cluster", str(ROOT / f"profiles/{env}.yaml"), "--model", model,
                    "--out", str(paths[key])]) == 0
    return paths


def assert_plan_or_one_line_infeasible(code: int, out: str, err: str) -> None:
    assert "Traceback" not in err and "Error:" not in err, err
    if code == 3:
        assert len(err.strip().splitlines()) == 1 and err.startswith("error: no plan fits"), err
    else:
        assert code == 0, err
        assert json.loads(out)


@pytest.mark.parametrize("strategy", TRAINING_STRATEGIES)
@pytest.mark.parametrize("case,batch", [("a-resnet50", 256), ("d-mobilenetv2", 128)])
def test_every_strategy_at_one_micro_batch_plans_or_exits_3(cli, preset_profiles, strategy, case, batch):
    code, out, err = cli("plan", "--profile", preset_profiles[case], "--global-batch", batch,
                         "--micro-batch", batch, "--strategy", strategy, "--json")
    assert_plan_or_one_line_infeasible(code, out, err)
    if case == "d-mobilenetv2" and strategy == "dapple":
        assert code == 0 and json.loads(out)["num_micro_batches"] == 1


@pytest.mark.parametrize("case,batch", [("a-resnet50", 256), ("d-mobilenetv2", 128)])
def test_compare_at_one_micro_batch(cli, preset_profiles, case, batch):
    code, out, err = cli("plan", "--profile", preset_profiles[case], "--global-batch", batch,
                         "--micro-batch", batch, "--compare", "--json")
    assert_plan_or_one_line_infeasible(code, out, err)
    if code == 0:
        rows = json.loads(out)
        assert {r["strategy"] for r in rows} == set(TRAINING_STRATEGIES)
        if case == "d-mobilenetv2":
            assert all(r["feasible"] for r in rows if r["strategy"] in ("asteroid", "dp", "dapple"))


def test_infeasible_single_micro_batch_matches_the_two_micro_batch_message(cli, preset_profiles):
    # 512/256 always gave a clean exit 3; 256/256 must say the same thing about the same device
    path = preset_profiles["a-resnet50"]
    one = cli("plan", "--profile", path, "--global-batch", 256, "--micro-batch", 256)
    two = cli("plan", "--profile", path, "--global-batch", 512, "--micro-batch", 256)
    assert one[0] == two[0] == 3
    assert len(one[2].strip().splitlines()) == 1 and "try a smaller --micro-batch" in one[2]
