"""One rank of a stock PyTorch peer, trained on the same model, data and optimizer as `hppctl run`.

bench/peers.py starts it on every lab host over SSH (in the host's netns and cgroup), under
`python -m torch.distributed.run` (static rendezvous: --master-addr/--master-port/--node-rank);
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from there. Modes:

- `ddp`: `DistributedDataParallel` (default buckets) over the whole model; each rank trains its
  equal share of the global batch per step (256 over 3 ranks: 86, 85, 85 samples), in one
  forward and backward.
- `pipe-1f1b` / `pipe-gpipe`: `torch.distributed.pipelining` with `Schedule1F1B` / `ScheduleGPipe`;
  rank i runs the layers `--stages` gives it (hppctl's `pp` plan: one device per stage), cut out of
  the model by `hppctl.zoo.build_stage` exactly as hppctl's workers cut theirs; global batch /
  micro-batch micro-batches per step.

What is shared with hppctl, so both sides compute the same thing: the model is the zoo's, built
from the same seed (`get_model(m).build(seed=...)`, as `runtime/stage.py` does); the samples of
step r are round r's of hppctl's `SampleOrder` (digits, 32x32, same permutation); SGD with the
same lr and momentum (0.9, hppctl's default); one thread. The loss is cross-entropy, averaged over
the global batch (hppctl: sum per micro-batch / global batch; pipelining: mean per micro-batch with
`scale_grads`; DDP: mean per rank, gradients averaged). Each rank seeds torch before step r as
hppctl's workers do before round r (`runtime.config.dropout_seed`), so its dropout masks can
be reproduced: bench/peers.py checks step 0's loss against a reference computed that way.

Prints one line `PEER_RESULT {json}`: this rank's per-step wall times (from the end of one step to
the end of the next; step 0 from just before it starts) and, on the rank that sees it, the loss of
every step; then ends at once, without Python's finalization (`end_before_finalization` says why).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hppctl.planner.inference_costs import split_rows  # noqa: E402  (torch-free, as this module's top is)
from hppctl.runtime.config import dropout_seed  # noqa: E402

MODES = ("ddp", "pipe-1f1b", "pipe-gpipe")
RESULT_PREFIX = "PEER_RESULT "


def schedule_refusal(mode: str, micro_batches: int, stages: int) -> str | None:
    """Why torch's schedule for `mode` will not run `micro_batches` per step over `stages` ranks, or None:
    Schedule1F1B's constructor raises ValueError below one micro-batch per stage (ScheduleGPipe has no
    such bound). bench/peers.py asks before training anything, so the run is not lost halfway."""
    if mode == "pipe-1f1b" and micro_batches < stages:
        return (f"torch's Schedule1F1B needs at least as many micro-batches per step as stages: "
                f"{micro_batches} micro-batches, {stages} stages")
    return None


def parse_stages(text: str) -> list[tuple[int, int]]:
    """`0:20,20:142` -> [(0, 20), (20, 142)]."""
    return [(int(a), int(b)) for a, b in (part.split(":") for part in text.split(","))]


def equal_share(global_batch: int, world: int, rank: int) -> tuple[int, int]:
    """Rank's contiguous sample range [lo, hi) of a step: the batch split as evenly as it goes
    (numpy.array_split's rule: the first `global_batch % world` ranks get one more)."""
    sizes = split_rows(global_batch, world)
    lo = sum(sizes[:rank])
    return lo, lo + sizes[rank]


def arguments(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--granularity", default="fine")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=14)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stages", help="pipe modes: each rank's layer range, `a:b,b:c,...`")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = arguments(argv)
    # Python's stacks on stderr (which bench/peers.py reports) when a rank aborts (a C++ exception in a
    # gloo thread ends in SIGABRT), and on `kill -USR1` to see where a hung rank waits.
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    try:
        result = train(args, rank, world)
    finally:
        dist.destroy_process_group()
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    end_before_finalization()


def end_before_finalization() -> None:
    """End this rank now, exit code 0, without Python's finalization.

    Why: `DistributedDataParallel` keeps gloo's process group alive past `destroy_process_group` (its
    two `pt_gloo_runloop` threads and the `gloo_tcp_loop` thread still run after it, even once the DDP
    object is collected; without DDP they end there), and a gloo thread that lets go of the last
    collective's tensors while the interpreter finalizes must take the GIL: Python ends such a thread
    inside a C++ frame that may not unwind, and the process aborts after it printed its result
    ("terminate called without an active exception", SIGABRT). Its peer's torch.distributed.run then
    waits in its exit barrier (300 s) for an agent that has left. Everything this rank had to do is
    done and its result is flushed; nothing is lost by not finalizing."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def train(args, rank: int, world: int) -> dict:
    import torch

    from hppctl.runtime.data import SampleOrder, load_data
    from hppctl.zoo import get_model

    torch.manual_seed(args.seed)
    whole = get_model(args.model).build(seed=args.seed).train()
    data = load_data(args.dataset, args.model)
    order = SampleOrder(len(data.train), args.global_batch, args.micro_batch, args.seed)
    if args.mode == "ddp":
        step, params = ddp_step(whole, data, order, args, rank, world)
    else:
        step, params = pipe_step(whole, data, order, args, rank, world)
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=args.momentum)
    step_s, losses = [], []
    last = time.perf_counter()
    for r in range(args.rounds):
        torch.manual_seed(dropout_seed(args.seed, r, rank))  # dropout masks: hppctl's workers' rule
        optimizer.zero_grad(set_to_none=True)
        loss = step(r)
        optimizer.step()
        now = time.perf_counter()
        step_s.append(now - last)
        last = now
        if loss is not None:
            losses.append(loss)
    return {"rank": rank, "world": world, "mode": args.mode, "step_s": step_s,
            "losses": finish_losses(args, losses, rank, world)}


def finish_losses(args, losses: list, rank: int, world: int) -> list[float] | None:
    """Every step's global-batch loss on the rank that reports it (rank 0 for DDP, after one
    all-reduce at the end so that the steps themselves carry no extra collective; the last rank of a
    pipeline, which computes them); None on the others."""
    import torch
    import torch.distributed as dist

    if args.mode == "ddp":
        total = torch.tensor(losses, dtype=torch.float64)
        dist.all_reduce(total)
        return [float(v) / args.global_batch for v in total] if rank == 0 else None
    return [float(v) for v in losses] if rank == world - 1 else None


def ddp_step(whole, data, order, args, rank: int, world: int):
    """One DDP step: this rank's equal share of round r, one forward/backward; returns the share's
    loss summed over its samples (finish_losses adds the ranks' up)."""
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(whole)
    lo, hi = equal_share(args.global_batch, world, rank)

    def step(r: int) -> float:
        x, y = data.train.take(order.indices(r, 0, lo, hi))
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return float(loss.detach()) * (hi - lo)

    return step, model.parameters()


class Logits:
    """The last stage's output (a one-tuple, as hppctl.zoo.build_stage returns it) as the logits."""

    def __init__(self, module):
        self.module = module

    def __call__(self, out, target):
        import torch.nn.functional as F

        logits = out[0] if isinstance(out, (tuple, list)) else out
        return F.cross_entropy(logits, target)


def pipe_step(whole, data, order, args, rank: int, world: int):
    """One pipelining step: rank 0 feeds round r's inputs, the last rank its labels; the schedule
    splits them into global batch / micro-batch micro-batches."""
    import torch
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from hppctl.zoo import build_stage, layer_costs

    stages = parse_stages(args.stages)
    if len(stages) != world:
        raise SystemExit(f"--stages names {len(stages)} stages for {world} ranks")
    if args.global_batch % args.micro_batch:
        raise SystemExit(f"--micro-batch {args.micro_batch} does not divide --global-batch {args.global_batch}")
    layers = len(layer_costs(args.model, args.granularity))
    if stages[0][0] != 0 or stages[-1][1] != layers or any(a[1] != b[0] for a, b in zip(stages, stages[1:])):
        raise SystemExit(f"--stages {args.stages} does not cut the model's {layers} layers into consecutive ranges")
    start, end = stages[rank]
    module = build_stage(whole, args.granularity, start, end, mode="train")
    del whole  # the stage shares the parameters it uses; the rest of the model can go
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    schedule_class = Schedule1F1B if args.mode == "pipe-1f1b" else ScheduleGPipe
    n_micro = args.global_batch // args.micro_batch
    refusal = schedule_refusal(args.mode, n_micro, world)
    if refusal:
        raise SystemExit(f"{args.mode}: {refusal}")
    schedule = schedule_class(stage, n_microbatches=n_micro, loss_fn=Logits(module))
    first, last = rank == 0, rank == world - 1

    def step(r: int) -> float | None:
        x, y = data.train.take(order.indices(r, 0, 0, args.global_batch))
        losses: list = []
        if first and last:
            schedule.step(x, target=y, losses=losses)
        elif first:
            schedule.step(x)
        elif last:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        return sum(float(v.detach()) for v in losses) / len(losses) if last else None

    return step, module.parameters()


if __name__ == "__main__":
    main()
