"""GPU smoke test: profile, plan and train a 2-stage plan on two local workers sharing one CUDA GPU.

    python bench/gpu_smoke.py                      # tiny-mlp on digits, 30 rounds, outputs in out/gpu-smoke/
    python bench/gpu_smoke.py --rounds 50 --model tiny-cnn --out /tmp/smoke

What it does, through the `hppctl` commands a user runs (`hppctl.cli.run(argv)`):

1. CPU half (always): a cluster of two local devices `g0`, `g1` with `accelerator: cpu`; `hppctl
   profile` (measured, small grid), `hppctl plan --strategy pp` (one stage per device), `hppctl run`
   in fp32, bf16 and fp16 (the CPU's autocast), and the same request planned with `--split-backward`
   in fp32. Checked: every run learns (mean loss of the last three rounds below 0.6 x the first
   three), bf16 and fp16 end within RTOL_HALF of fp32, the split-backward run within RTOL.
2. GPU half (only with CUDA): the same two devices with `accelerator: cuda` (both workers share GPU
   0), profiled and planned again (the GPU's times and memory budget), trained in fp32 and fp16;
   the plan the GPU profile gave is also trained on the CPU cluster, and the GPU fp32 model must
   equal that CPU model within RTOL (relative norm per tensor: floating-point reassociation between
   CUDA and CPU kernels only; TF32 is off for matmuls by default) and the fp16 model within
   RTOL_HALF; the split-backward plan trained on the GPU in fp32 must equal it trained on the CPU
   within RTOL. Prints samples/s for CPU fp32, GPU fp32, GPU fp16 and the split runs.

Without CUDA it checks the CPU half, prints `skipped: no CUDA (...)` for the GPU half, and exits 0.
Exit 1 when a check fails, with the figures that failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RTOL = 1e-3
"""GPU fp32 against CPU fp32, relative norm of each tensor's difference after the run."""
RTOL_HALF = 5e-2
"""bf16 or fp16 (autocast; fp16 with one shared loss scale) against fp32 on the CPU."""


def hppctl(*argv) -> tuple[int, str]:
    """One command as a user runs it; (exit code, stdout)."""
    import contextlib
    import io

    from hppctl.cli import run

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run([str(a) for a in argv])
    return code, out.getvalue()


def cluster_file(path: Path, accelerator: str) -> Path:
    path.write_text("name: smoke\ndevices:\n"
                    f"  - {{name: g0, local: true, accelerator: {accelerator}}}\n"
                    f"  - {{name: g1, local: true, accelerator: {accelerator}}}\n")
    return path


def profile_and_plan(out: Path, cluster: Path, model: str, tag: str, args) -> Path:
    profile, plan = out / f"profile-{tag}.json", out / f"plan-{tag}.yaml"
    code, _ = hppctl("profile", "--cluster", cluster, "--model", model, "--batch-sizes", args.batch_sizes,
                     "--repeats", args.repeats, "--warmup", 1, "--no-links", "--out", profile)
    if code != 0:
        sys.exit(f"hppctl profile ({tag}) failed with exit {code}")
    for target, extra in ((plan, ()), (split_plan_of(plan), ("--split-backward",))):
        code, _ = hppctl("plan", "--profile", profile, "--strategy", "pp", "--global-batch", args.global_batch,
                         "--micro-batch", args.micro_batch, "--out", target, *extra)
        if code != 0:
            sys.exit(f"hppctl plan {' '.join(extra)} ({tag}) failed with exit {code}")
    return plan


def split_plan_of(plan: Path) -> Path:
    """The same request planned with --split-backward (I and W actions: runtime/split_backward.py)."""
    return plan.with_name(plan.stem + "-split" + plan.suffix)


def train(out: Path, plan: Path, cluster: Path, tag: str, precision: str, args) -> dict:
    model = out / f"model-{tag}-{precision}.pt"
    code, stdout = hppctl("run", "--plan", plan, "--cluster", cluster, "--dataset", args.dataset, "--rounds",
                          args.rounds, "--optimizer", "sgd", "--lr", args.lr, "--precision", precision,
                          "--save-model", model, "--metrics", out / f"metrics-{tag}-{precision}.jsonl", "--json")
    if code != 0:
        sys.exit(f"hppctl run ({tag}, {precision}) failed with exit {code}")
    summary = json.loads(stdout)
    losses = [json.loads(line)["loss"] for line in (out / f"metrics-{tag}-{precision}.jsonl").read_text().splitlines()]
    return {"summary": summary, "losses": losses, "model": model}


def learned(losses: list[float]) -> bool:
    return sum(losses[-3:]) < 0.6 * sum(losses[:3])


def throughput(run: dict) -> float:
    summary = run["summary"]
    for key in ("samples_per_s", "throughput_samples_per_s"):
        if key in summary:
            return float(summary[key])
    measured = summary.get("measured") or {}
    return float(measured.get("samples_per_s") or measured.get("throughput_samples_per_s") or 0.0)


def largest_difference(a: Path, b: Path) -> float:
    import torch

    x, y = torch.load(a), torch.load(b)
    return max(float((x[k].float() - y[k].float()).norm() / max(float(y[k].float().norm()), 1e-12))
               for k in y if y[k].is_floating_point())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-mlp")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--batch-sizes", default="4,8,16", help="the profile's grid")
    parser.add_argument("--repeats", type=int, default=2, help="the profile's timed passes")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--out", type=Path, default=REPO / "out" / "gpu-smoke")
    args = parser.parse_args()
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    failures = []
    cpu_cluster = cluster_file(args.out / "cluster-cpu.yaml", "cpu")
    cpu_plan = profile_and_plan(args.out, cpu_cluster, args.model, "cpu", args)
    cpu = train(args.out, cpu_plan, cpu_cluster, "cpu", "fp32", args)
    print(f"CPU fp32: {throughput(cpu):.1f} samples/s, loss {cpu['losses'][0]:.3f} -> {cpu['losses'][-1]:.3f}")
    if not learned(cpu["losses"]):
        failures.append(f"the CPU run did not learn: {cpu['losses']}")
    for precision in ("bf16", "fp16"):
        half = train(args.out, cpu_plan, cpu_cluster, "cpu", precision, args)
        difference = largest_difference(half["model"], cpu["model"])
        print(f"CPU {precision}: {throughput(half):.1f} samples/s, loss {half['losses'][0]:.3f} -> "
              f"{half['losses'][-1]:.3f}, largest relative difference from CPU fp32 {difference:.2e} "
              f"(tolerance {RTOL_HALF:g})")
        if difference > RTOL_HALF or not learned(half["losses"]):
            failures.append(f"CPU {precision}: difference {difference:.2e}, losses {half['losses']}")
    split = train(args.out, split_plan_of(cpu_plan), cpu_cluster, "cpu-split", "fp32", args)
    difference = largest_difference(split["model"], cpu["model"])
    print(f"CPU fp32, split backward: {throughput(split):.1f} samples/s, largest relative difference from CPU fp32 "
          f"{difference:.2e} (tolerance {RTOL:g})")
    if difference > RTOL:
        failures.append(f"CPU split backward differs from whole backwards by {difference:.2e} > {RTOL:g}")
    if not torch.cuda.is_available():
        for failure in failures:
            print(f"FAILED: {failure}")
        print(f"skipped: no CUDA (torch {torch.__version__} sees no CUDA device): the GPU half did not run; "
              f"CPU half {'FAILED' if failures else 'passed'}")
        return 1 if failures else 0
    gpu_cluster = cluster_file(args.out / "cluster-cuda.yaml", "cuda")
    gpu_plan = profile_and_plan(args.out, gpu_cluster, args.model, "cuda", args)
    reference = train(args.out, gpu_plan, cpu_cluster, "cpu-on-gpu-plan", "fp32", args)
    print(f"GPU: {torch.cuda.get_device_name(0)}")
    for precision, rtol in (("fp32", RTOL), ("fp16", RTOL_HALF)):
        run = train(args.out, gpu_plan, gpu_cluster, "cuda", precision, args)
        difference = largest_difference(run["model"], reference["model"])
        print(f"GPU {precision}: {throughput(run):.1f} samples/s, loss {run['losses'][0]:.3f} -> "
              f"{run['losses'][-1]:.3f}, largest relative difference from the CPU run {difference:.2e} "
              f"(tolerance {rtol:g})")
        if difference > rtol:
            failures.append(f"GPU {precision} differs from the CPU run by {difference:.2e} > {rtol:g}")
        if not learned(run["losses"]):
            failures.append(f"the GPU {precision} run did not learn: {run['losses']}")
    split_reference = train(args.out, split_plan_of(gpu_plan), cpu_cluster, "cpu-on-gpu-plan-split", "fp32", args)
    split_run = train(args.out, split_plan_of(gpu_plan), gpu_cluster, "cuda-split", "fp32", args)
    difference = largest_difference(split_run["model"], split_reference["model"])
    print(f"GPU fp32, split backward: {throughput(split_run):.1f} samples/s, largest relative difference from the "
          f"CPU run {difference:.2e} (tolerance {RTOL:g})")
    if difference > RTOL or not learned(split_run["losses"]):
        failures.append(f"GPU split backward: difference {difference:.2e}, losses {split_run['losses']}")
    for failure in failures:
        print(f"FAILED: {failure}")
    print("gpu smoke " + ("FAILED" if failures else "passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
