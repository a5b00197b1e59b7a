"""Which optimizer defaults learn: every built-in training model x dataset x candidate default.

    python bench/defaults.py            # the table in docs/runtime.md ("Default optimizer"), ~30 min on 2 busy cores
    python bench/defaults.py --longer   # mobilenetv2 for 3 epochs, efficientnet-b1 for 2 (~5 min)
    python bench/defaults.py --majority # each cell's majority-class share: the accuracy of learning nothing
    python bench/defaults.py --models tiny-cnn,vgg-mini --candidates sgd-0.05,adam-0.001 --epochs 2
    python bench/defaults.py --quick    # 1 epoch of the small models only (a smoke run)

Each cell trains the model from `--seed 0` weights with the same math as `hppctl run` on a plan of one
device per stage (global batch 64, micro-batches of 16 as in examples/plan-local*.yaml): the
optimizer of runtime/worker.py (`make_optimizer`, `set_learning_rate`, `TrainOptions.learning_rate`),
the sample order of runtime/data.py (`SampleOrder`), each micro-batch's summed cross-entropy / 64
backpropagated before one step per round, BatchNorm statistics taken per micro-batch of 16. It then
reports the final round's training loss, the test accuracy with the trained running averages, and for
BatchNorm models the test accuracy after `--bn-recalibrate 512` (runtime/results.py). `synthetic` has
no test split: its accuracy is over the 2048 training samples, in eval mode. Token models take
`synthetic` only (`digits` are images).

Budgets: `epochs` below, fewer for the heavy models (each row says how many rounds it ran; `*`: capped
below the epochs); `--epochs N` gives every selected cell N epochs. One torch thread by default: with
two on a busy 2-core machine the small cells ran 50x slower.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from hppctl.runtime.config import TrainOptions  # noqa: E402
from hppctl.runtime.data import SampleOrder, load_data  # noqa: E402
from hppctl.runtime.results import accuracy, recalibrate_batchnorm  # noqa: E402
from hppctl.runtime.worker import make_optimizer, set_learning_rate  # noqa: E402
from hppctl.zoo import get_model  # noqa: E402

GLOBAL_BATCH, MICRO_BATCH = 64, 16
RECALIBRATE_SAMPLES = 512

CANDIDATES = {
    "sgd-0.05": dict(optimizer="sgd", lr=0.05, momentum=0.9),  # the default before issue 25
    "adam-0.0001": dict(optimizer="adam", lr=0.0001),
    "adam-0.0003": dict(optimizer="adam", lr=0.0003),
    "adam-0.001": dict(optimizer="adam", lr=0.001),
    "adam-0.002": dict(optimizer="adam", lr=0.002),
    "adam-0.002-cosine": dict(optimizer="adam", lr=0.002, lr_schedule="cosine"),
    "adam-0.005": dict(optimizer="adam", lr=0.005),
    "adam-0.01": dict(optimizer="adam", lr=0.01),
    "adam-0.02": dict(optimizer="adam", lr=0.02),
    "adam-0.05": dict(optimizer="adam", lr=0.05),
}
SMALL = ("sgd-0.05", "adam-0.0003", "adam-0.001", "adam-0.002", "adam-0.002-cosine", "adam-0.005", "adam-0.01",
         "adam-0.02", "adam-0.05")
"""Every candidate where a cell takes seconds."""
HEAVY = ("sgd-0.05", "adam-0.001", "adam-0.002", "adam-0.02")
TEXT = ("sgd-0.05", "adam-0.0001", "adam-0.0003", "adam-0.001", "adam-0.002", "adam-0.02")

CELLS = [  # (model, dataset, epochs, at most this many rounds or None, candidates)
    ("tiny-mlp", "digits", 5, None, SMALL),
    ("tiny-mlp", "synthetic", 5, None, SMALL),
    ("tiny-cnn", "digits", 5, None, SMALL),
    ("tiny-cnn", "synthetic", 5, None, SMALL),
    ("vgg-mini", "digits", 3, None, SMALL),
    ("vgg-mini", "synthetic", 3, None, SMALL),
    ("tiny-bert", "synthetic", 5, None, TEXT),
    ("mobilenetv2", "digits", 1, None, HEAVY),
    ("efficientnet-b1", "digits", 1, 12, HEAVY),
    ("bert-small", "synthetic", 1, 12, TEXT),
    ("resnet50", "digits", 1, 4, ("sgd-0.05", "adam-0.001")),
]
LONGER = [("efficientnet-b1", "digits", 2, None, HEAVY[:3]), ("mobilenetv2", "digits", 3, None, HEAVY[:3])]
"""`--longer`: the heavy CNNs with budgets where something learns (the default table stops early)."""
QUICK = [("tiny-mlp", "digits", 1, None, SMALL), ("tiny-cnn", "digits", 1, None, SMALL), ("tiny-bert", "synthetic", 1, None, TEXT)]


def train_cell(model: str, dataset: str, candidate: dict, epochs: int, max_rounds: int | None, seed: int) -> dict:
    """One cell: train, then the loss of the last round and the accuracies."""
    data = load_data(dataset, model)
    per_epoch = len(data.train) // GLOBAL_BATCH
    rounds = epochs * per_epoch if max_rounds is None else min(max_rounds, epochs * per_epoch)
    options = TrainOptions(dataset=dataset, seed=seed, rounds=rounds, **candidate)
    net = get_model(model).build(seed=seed).train()
    opt = make_optimizer(net.parameters(), options)
    order = SampleOrder(len(data.train), GLOBAL_BATCH, MICRO_BATCH, seed)
    started = time.perf_counter()
    loss_sum = 0.0
    for r in range(rounds):
        set_learning_rate(opt, options.learning_rate(r))
        opt.zero_grad()
        loss_sum = 0.0
        for m in range(GLOBAL_BATCH // MICRO_BATCH):
            x, y = data.train.take(order.indices(r, m, 0, MICRO_BATCH))
            loss = F.cross_entropy(net(x), y, reduction="sum") / GLOBAL_BATCH
            loss.backward()
            loss_sum += float(loss.detach())
        opt.step()
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    evaluated = data.test if data.test is not None else data.train
    row = {"rounds": rounds, "loss": loss_sum, "accuracy": accuracy(model, state, evaluated), "recalibrated": None}
    indices = order.permutation(0)[:RECALIBRATE_SAMPLES]
    recal = recalibrate_batchnorm(model, state, data.train, indices, MICRO_BATCH)
    if recal is not None:
        row["recalibrated"] = accuracy(model, recal, evaluated)
    row["seconds"] = time.perf_counter() - started
    return row


def majority_share(model: str, dataset: str) -> float:
    """The share of the most frequent label in the split `train_cell` measures accuracy on."""
    data = load_data(dataset, model)
    labels = (data.test if data.test is not None else data.train).labels
    return float(torch.bincount(labels).max()) / len(labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated subset of the cells' models")
    parser.add_argument("--candidates", help="comma-separated subset of each cell's candidates: " + ", ".join(CANDIDATES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--epochs", type=int, help="every cell's epochs (and no round cap) instead of its own budget")
    parser.add_argument("--longer", action="store_true", help="efficientnet-b1 for 2 epochs, mobilenetv2 for 3 (~20 min)")
    parser.add_argument("--majority", action="store_true",
                        help="print each cell's majority-class share (the accuracy of a model that learned nothing but the prior) and exit")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cells = QUICK if args.quick else LONGER if args.longer else CELLS
    if args.models:
        wanted = args.models.split(",")
        cells = [c for c in cells if c[0] in wanted]
    only = args.candidates.split(",") if args.candidates else None
    if args.epochs:
        cells = [(model, dataset, args.epochs, None, names) for model, dataset, _, _, names in cells]
    if args.majority:
        print(f"# python bench/defaults.py {' '.join(sys.argv[1:])}")
        for model, dataset, *_ in cells:
            print(f"{model:<16} {dataset:<10} majority class {majority_share(model, dataset):.1%}")
        return
    print(f"# python bench/defaults.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"# global batch {GLOBAL_BATCH}, micro-batch {MICRO_BATCH}, seed {args.seed}, {args.threads} threads; "
          f"accuracy: digits test split (359), synthetic training set (2048); recal: after --bn-recalibrate "
          f"{RECALIBRATE_SAMPLES}")
    print(f"{'model':<16} {'dataset':<10} {'default':<20} {'rounds':>7} {'loss':>8} {'accuracy':>9} "
          f"{'recal':>7} {'time':>7}")
    for model, dataset, epochs, max_rounds, names in cells:
        for name in [n for n in names if only is None or n in only]:
            row = train_cell(model, dataset, CANDIDATES[name], epochs, max_rounds, args.seed)
            recal = f"{row['recalibrated']:.1%}" if row["recalibrated"] is not None else "-"
            budget = f"{row['rounds']}" + ("*" if max_rounds is not None else "")
            print(f"{model:<16} {dataset:<10} {name:<20} {budget:>7} {row['loss']:>8.3f} {row['accuracy']:>9.1%} "
                  f"{recal:>7} {row['seconds']:>6.0f}s", flush=True)
    if any(c[3] is not None for c in cells):
        print("# *: fewer rounds than the epochs (heavy model on a 2-core machine)")


if __name__ == "__main__":
    main()
