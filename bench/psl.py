"""Parallel split learning: every method on synthetic client/helper sets built from device presets.

    python bench/psl.py                 # all parts, ~10 min on a shared 2-core box; figures in docs/psl.md
    python bench/psl.py --part table2   # one part: table2 | methods | helpers
    python bench/psl.py --quick         # fewer instances (a smoke run)

Instances (the paper's §VII, with hppctl's presets and zoo models in place of its testbed):
- Scenario 1 (low heterogeneity): every client a random one of rpi4, jetson-nano, jetson-tx2; every
  helper a random one of laptop-cpu, jetson-nx, jetson-orin-nano; the presets' memory budgets; one
  cut for all clients; 50 Mbit/s client-helper links.
- Scenario 2 (high heterogeneity): as 1, then each device's compute times scaled by a random factor
  in [0.5, 2] (interpolating between device types), each helper's memory a random 10-100 % of its
  budget, each client's cut and its link (10-100 Mbit/s) drawn at random.

Parts:
1. table2: exact integer program (HiGHS) vs the decomposition (admm) on small instances, as the
   paper's Table II: suboptimality of admm's slot makespan and the speedup of its solver time.
2. methods: random+FCFS, balanced-greedy, admm, auto for 10-100 clients and 2-10 helpers (Fig. 7):
   makespan of each plan replayed in the simulator with unrounded times, solver times, and auto's
   gain over random+FCFS against the paper's "up to 52.3 %, on average 23.4 %".
3. helpers: 100 clients, 1-10 helpers, balanced-greedy (Fig. 8: "1 -> 2 helpers: up to -47.6 %").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hppctl.errors import Infeasible  # noqa: E402
from hppctl.models.profile import Profile  # noqa: E402
from hppctl.models.psl import PslRequest, PslSpec, PslTimes  # noqa: E402
from hppctl.planner.psl import pair_times, plan_times  # noqa: E402
from hppctl.planner.psl.admm import CODE_RHO, RHO  # noqa: E402
from hppctl.planner.psl.instance import Instance, auto_slot  # noqa: E402
from hppctl.schedule.psl_sim import simulate_psl  # noqa: E402

CLIENT_PRESETS = ("rpi4", "jetson-nano", "jetson-tx2")
HELPER_PRESETS = ("laptop-cpu", "jetson-nx", "jetson-orin-nano")
MODELS = {"mobilenetv2": (3, 15), "efficientnet-b1": (3, 23)}
"""Model -> the scenario-1 cut [σ1, σ2] (part 2 is the bulk of the network, as the paper's 3/33 and 3/23)."""
BATCH = 32


def scenario(kind: int, model: str, clients: int, helpers: int, seed: int) -> tuple[PslTimes, PslRequest]:
    """One synthetic instance (see the module docstring)."""
    from hppctl.driver import spec_profile

    rng = np.random.default_rng(seed)
    cut = list(MODELS[model])
    c_presets = rng.choice(CLIENT_PRESETS, clients)
    h_presets = rng.choice(HELPER_PRESETS, helpers)
    spec = {"name": f"s{kind}", "model": model, "cut": cut, "batch": BATCH, "bandwidth": "50mbit",
            "clients": [{"name": f"c{j}", "preset": str(p)} for j, p in enumerate(c_presets)],
            "helpers": [{"name": f"h{i}", "preset": str(p)} for i, p in enumerate(h_presets)]}
    if kind == 2:
        layers = 18 if model == "mobilenetv2" else 25
        for c in spec["clients"]:
            s1 = int(rng.integers(1, 5))
            c["cut"] = [s1, int(rng.integers(layers - 6, layers - 1))]
            c["bandwidth"] = f"{rng.uniform(10, 100):.1f}mbit"
    psl = PslSpec.model_validate(spec)
    profile = spec_profile(psl, f"scenario {kind}")
    if kind == 2:
        profile = _heterogeneous(profile, rng)
    return pair_times(profile, psl.request()), psl.request()


def _heterogeneous(profile: Profile, rng: np.random.Generator) -> Profile:
    devices = []
    for d in profile.devices:
        f = float(rng.uniform(0.5, 2.0))
        update = {"forward_s": [[t * f for t in row] for row in d.forward_s],
                  "backward_s": [[t * f for t in row] for row in d.backward_s]}
        if d.name.startswith("h"):
            update["memory_bytes"] = int(d.memory_bytes * rng.uniform(0.1, 1.0))
        devices.append(d.model_copy(update=update))
    return profile.model_copy(update={"devices": devices})


def run(times: PslTimes, request: PslRequest, method: str, **options):
    """(plan, simulated makespan s, solver s) or None if the method finds the instance infeasible."""
    try:
        plan = plan_times(times, request, method, **options)
    except Infeasible:
        return None
    return plan, simulate_psl(plan).makespan_s, plan.solver_time_s


# ---------------------------------------------------------------------------------------------


def part_table2(quick: bool) -> None:
    print("\n## 1. exact (HiGHS) vs decomposition (admm) on small instances — paper Table II")
    print("subopt = admm slot makespan / exact - 1 (same slot grid, T_f ~ 60 slots); speedup = exact time / admm time; "
          f"admm with hppctl's rho = {RHO:g} and with the released code's rho = {CODE_RHO:g}")
    cases = [(1, 6, 2), (1, 8, 2), (1, 10, 2), (1, 10, 3), (2, 6, 2), (2, 8, 2), (2, 10, 2), (2, 10, 3)]
    bases = (100,) if quick else (100, 700)
    if quick:
        cases = cases[:2] + cases[4:6]
    print(f"{'scen':>4} {'model':<16} {'J':>3} {'I':>2} {'seed':>4} {'T':>4} {'exact':>5} {'status':<8} {'admm':>5} "
          f"{'subopt':>7} {'exact s':>8} {'admm s':>7} {'speedup':>8} {'rho350':>6} {'subopt':>7}")
    gaps, code_gaps, speedups = [], [], []
    for base in bases:
        for kind, J, I in cases:
            for model in MODELS:
                seed = base + J + I
                times, request = scenario(kind, model, J, I, seed=seed)
                slot = auto_slot(Instance.from_times(times), 60)
                common = dict(model=model, slot_s=slot, time_limit_s=120.0)
                exact = plan_times(times, request, "exact", **common)
                admm = plan_times(times, request, "admm", **common)
                code = plan_times(times, request, "admm", rho=CODE_RHO, **common)
                e, a, c = (p.prediction.makespan_slots for p in (exact, admm, code))
                status = exact.notes[0].split(",")[0].removeprefix("exact: ")
                T = int(np.ceil(Instance.from_times(times).quantize(slot).horizon()))
                speed = exact.solver_time_s / admm.solver_time_s
                gaps.append(a / e - 1)
                code_gaps.append(c / e - 1)
                speedups.append(speed)
                flag = "  <- BELOW THE OPTIMUM: solver bug" if min(a, c) < e and status == "optimal" else ""
                print(f"{kind:>4} {model:<16} {J:>3} {I:>2} {seed:>4} {T:>4} {e:>5} {status:<8} {a:>5} {a / e - 1:>7.1%} "
                      f"{exact.solver_time_s:>8.2f} {admm.solver_time_s:>7.2f} {speed:>7.1f}x {c:>6} {c / e - 1:>7.1%}{flag}")
    for name, values in ((f"rho {RHO:g}", gaps), (f"rho {CODE_RHO:g}", code_gaps)):
        print(f"admm ({name}) suboptimality over {len(values)} instances: max {max(values):.1%}, mean "
              f"{statistics.mean(values):.1%}, above 14.9 %: {sum(g > 0.149 for g in values)} "
              f"(paper: <= 14.9 %, mostly <= 10.2 %)")
    print(f"speedup (exact / admm solver time): min {min(speedups):.1f}x, median {statistics.median(speedups):.1f}x, "
          f"max {max(speedups):.1f}x, admm faster on {sum(s > 1 for s in speedups)} of {len(speedups)} "
          f"(paper: 12.5x-52x against Gurobi)")


def part_methods(quick: bool) -> None:
    print("\n## 2. methods vs random+FCFS — paper Fig. 7 / Observation 3")
    print("makespan = the plan replayed in the simulator with unrounded times (s); gain = 1 - auto / random+FCFS; "
          "solver times in ms")
    grid = [(10, 2), (20, 2), (30, 5), (50, 5), (50, 10), (100, 5), (100, 10)]
    seeds = (1,) if quick else (1, 2)
    if quick:
        grid = [(10, 2), (30, 5), (100, 10)]
    print(f"{'scen':>4} {'model':<16} {'J':>3} {'I':>2} {'seed':>4} {'random':>7} {'greedy':>7} {'admm':>7} "
          f"{'auto':>7} {'auto chose':<15} {'gain':>6} {'greedy ms':>9} {'admm ms':>8} {'auto ms':>8}")
    rows = []
    for kind in (1, 2):
        for model in MODELS:
            for J, I in grid:
                for seed in seeds:
                    row = _methods_row(kind, model, J, I, seed)
                    if row is not None:
                        rows.append(row)
    gains = [1 - r["auto"] / r["random-fcfs"] for r in rows]
    print(f"auto vs random+FCFS over {len(rows)} instances: max gain {max(gains):.1%}, mean {statistics.mean(gains):.1%}, "
          f"min {min(gains):.1%} (paper: up to 52.3 %, on average 23.4 %)")
    both = [r for r in rows if r["admm"] is not None]
    admm_gain = [1 - r["admm"] / r["balanced-greedy"] for r in both]
    print(f"admm vs balanced-greedy (J <= 50, {len(both)} instances): admm better by up to {max(admm_gain):.1%}, "
          f"worse on {sum(g < 0 for g in admm_gain)} (paper: up to 32 % better for medium sizes, up to 48 % in scenario 2)")
    greedy_gain = [1 - r["balanced-greedy"] / r["random-fcfs"] for r in rows]
    print(f"balanced-greedy vs random+FCFS: mean gain {statistics.mean(greedy_gain):.1%}, random better on "
          f"{sum(g < 0 for g in greedy_gain)} of {len(rows)} (paper: random beats greedy on its (30, 5) VGG19 instance)")


def _methods_row(kind: int, model: str, J: int, I: int, seed: int) -> dict | None:
    for attempt in range(5):  # scenario 2 may draw helpers too small for the clients: redraw
        times, request = scenario(kind, model, J, I, seed=1000 * seed + 10 * J + I + attempt)
        common = dict(model=model, time_limit_s=120.0, seed=seed)
        results = {m: run(times, request, m, **common) for m in ("random-fcfs", "balanced-greedy")}
        if results["random-fcfs"] is not None and results["balanced-greedy"] is not None:
            break
    else:
        print(f"{kind:>4} {model:<16} {J:>3} {I:>2} {seed:>4} infeasible in 5 draws")
        return None
    results["admm"] = run(times, request, "admm", **common) if J <= 50 else None
    results["auto"] = run(times, request, "auto", **common)

    def cell(m: str) -> str:
        return f"{results[m][1]:>7.3f}" if results[m] else f"{'-':>7}"

    def ms(m: str, width: int) -> str:
        return f"{results[m][2] * 1e3:>{width}.1f}" if results[m] else f"{'-':>{width}}"

    gain = 1 - results["auto"][1] / results["random-fcfs"][1]
    print(f"{kind:>4} {model:<16} {J:>3} {I:>2} {seed:>4} {cell('random-fcfs')} {cell('balanced-greedy')} {cell('admm')} "
          f"{cell('auto')} {results['auto'][0].method:<15} {gain:>6.1%} {ms('balanced-greedy', 9)} {ms('admm', 8)} "
          f"{ms('auto', 8)}")
    return {m: (r[1] if r else None) for m, r in results.items()}


def part_helpers(quick: bool) -> None:
    print("\n## 3. number of helpers, 100 clients, balanced-greedy, scenario 1 — paper Fig. 8")
    print("helpers are added in a fixed random order of types; 'no mem' = 100 clients do not fit the helpers' memory")
    seeds = (1,) if quick else (1, 2, 3)
    print(f"{'model':<16} {'seed':>4} " + " ".join(f"{f'I={i}':>7}" for i in range(1, 11)) + f" {'1->2':>7}")
    for model in MODELS:
        for seed in seeds:
            spans = []
            full = scenario(1, model, 100, 10, seed=seed)
            for I in range(1, 11):
                sub = _helpers_subset(*full, list(range(I)))
                result = run(*sub, "balanced-greedy", model=model)
                spans.append(result[1] if result else float("nan"))
            cells = " ".join(f"{s:>7.3f}" if s == s else f"{'no mem':>7}" for s in spans)
            drop = f"{spans[1] / spans[0] - 1:>7.1%}" if spans[0] == spans[0] else f"{'-':>7}"
            print(f"{model:<16} {seed:>4} {cells} {drop}")


def _helpers_subset(times: PslTimes, request: PslRequest, keep: list[int]) -> tuple[PslTimes, PslRequest]:
    """The same clients with only the first helpers (so every I sees the same devices)."""
    data = times.model_dump()
    for f in ("r_s", "p_s", "l_s", "l_prime_s", "p_prime_s", "r_prime_s"):
        data[f] = [data[f][i] for i in keep]
    data["capacity_bytes"] = [data["capacity_bytes"][i] for i in keep]
    req = request.model_copy(update={"helpers": [request.helpers[i] for i in keep]})
    return PslTimes.model_validate(data), req


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("table2", "methods", "helpers"), action="append")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    parts = args.part or ["table2", "methods", "helpers"]
    print(f"# bench/psl.py — machine: {os.cpu_count()} cores (shared), python {sys.version.split()[0]}, "
          f"batch {BATCH}, {time.strftime('%Y-%m-%d %H:%M')}")
    plan_times  # noqa: B018  (warm the scipy import so the first solver time is not its import)
    from scipy.optimize import milp  # noqa: F401
    for part in parts:
        {"table2": part_table2, "methods": part_methods, "helpers": part_helpers}[part](args.quick)


if __name__ == "__main__":
    main()
