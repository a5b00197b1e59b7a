"""Training data and the sample order every worker derives on its own.

`--dataset` is one of:

- `synthetic`: 2048 inputs of the model's shape whose labels are balanced over the model's classes
  (each class ⌊2048/C⌋ or ⌈2048/C⌉ times) and a function of the input a model of its family can
  learn: for token models class c owns the c-th of C disjoint slices of the token ids, position 0
  holds a token of that slice and each other position one with probability 3/4 (else any id);
  image and feature inputs are the class's fixed smooth prototype plus Gaussian noise (σ 2). The
  same samples for every `--seed` (only the order changes).
- `digits`: scikit-learn's bundled handwritten digits (1797 8×8 grey images, 10 classes, no
  download), scaled to [-1, 1] and resized to the model's input: bilinear to H×W and repeated over
  C channels for image models, linearly interpolated over the 64 pixels for feature models. A fixed
  20% (359 images, independent of `--seed`) is held out as the test split.
- `package.module:factory`: `factory()` returns a torch `Dataset` of `(input, label)` pairs, or a
  `(train, test)` pair of them.
- a path: a folder of images with one sub-folder per class, a `.pt` file holding `(inputs, labels)`, an
  `.npz` file with `x` and `y`, or a `.csv` file (`PATH#label=NAME`: `--label-column NAME`); read,
  checked and split (about 80/20, by a hash of each sample's key) by `runtime/datasets.py` (docs/runtime.md, "Your data").

The order of the training samples is a permutation drawn from (seed, epoch). Round r covers
positions [r·G, (r+1)·G) of its epoch's permutation (G the global batch; an epoch has
⌊N/G⌋ rounds and drops the remainder), and micro-batch m's sample i is position r·G + m·B + i.
So the head stage reads inputs and the tail stage reads labels for the same samples without any
labels being shipped, and a resumed run continues with exactly the samples it would have seen.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import torch

from hppctl.errors import BadInput

SYNTHETIC_SAMPLES = 2048
DIGITS_TEST_FRACTION = 0.2
_DATA_SEED = 1234
"""Fixed: synthetic samples and the digits split do not change with --seed (only the order does)."""


@dataclass(frozen=True)
class Split:
    """Inputs and integer labels held in memory, or a user Dataset read sample by sample."""

    inputs: torch.Tensor | None
    labels: torch.Tensor | None
    dataset: Any = None

    def __len__(self) -> int:
        return len(self.dataset) if self.dataset is not None else int(self.labels.shape[0])

    def take(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.dataset is None:
            return self.inputs[indices], self.labels[indices]
        pairs = [self.dataset[int(i)] for i in indices]
        xs = torch.stack([torch.as_tensor(x) for x, _ in pairs])
        ys = torch.as_tensor([int(y) for _, y in pairs], dtype=torch.long)
        return xs, ys


@dataclass(frozen=True)
class Data:
    name: str
    train: Split
    test: Split | None
    num_classes: int


def model_io(model: str) -> tuple[tuple[int, ...], torch.dtype, int]:
    """Per-sample input shape, input dtype and number of classes (the logits' last dimension)."""
    from hppctl.zoo import get_model, trace

    spec = get_model(model)
    traced = trace(model, "train")
    output = next(n for n in traced.nodes if n.op == "output")
    logits = traced.values1[output.args[0]] if not isinstance(output.args[0], (tuple, list)) else None
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise BadInput(f"model {model!r}: its output is not (batch, classes) logits; `hppctl run` trains classifiers")
    dtype = torch.long if spec.input_kind == "tokens" else torch.float32
    return tuple(spec.input_shape), dtype, int(logits.shape[-1])


def load_data(dataset: str, model: str) -> Data:
    """The dataset named by `--dataset`, shaped for `model`; `BadInput` if it cannot be."""
    shape, dtype, classes = model_io(model)
    if dataset == "synthetic":
        train = _synthetic(shape, dtype, classes, _token_ids(model) if dtype == torch.long else 0)
        return Data("synthetic", train, None, classes)
    if dataset == "digits":
        train, test = _digits(shape, dtype, model)
        return Data("digits", train, test, classes)
    from hppctl.runtime.datasets import is_file_dataset

    if is_file_dataset(dataset):
        return _file_dataset(dataset, shape, dtype, classes, model)
    if ":" in dataset:
        return _user(dataset, shape, classes)
    raise BadInput(f"--dataset: unknown dataset {dataset!r} (synthetic, digits, a folder of images, a .pt, .npz or "
                   f".csv file, or package.module:factory)")


def _file_dataset(spec: str, shape: tuple[int, ...], dtype: torch.dtype, classes: int, model: str) -> Data:
    """A folder of images or a .pt/.npz/.csv file (runtime/datasets.py), as in-memory splits."""
    from hppctl.runtime.datasets import load_file_dataset

    vocabulary = _vocabulary(model) if dtype == torch.long else None
    loaded = load_file_dataset(spec, shape, dtype, classes, vocabulary)
    test = Split(loaded.test_inputs, loaded.test_labels) if loaded.test_labels is not None else None
    return Data(spec, Split(loaded.train_inputs, loaded.train_labels), test, classes)


def _vocabulary(model: str) -> int | None:
    """A token model's vocabulary size, to refuse ids its embedding would fail on; None when the zoo
    does not describe the model (the workers' embedding then reports an id out of range)."""
    from hppctl.zoo import get_model
    from hppctl.zoo.build import vocab_size

    try:
        return int(vocab_size(get_model(model)))
    except Exception:  # noqa: BLE001 - a model the zoo does not know
        return None


def _token_ids(model: str) -> int:
    """Token ids synthetic samples draw from: the model's vocabulary, at most 1000 (a model with a
    smaller one failed in its embedding when 0-999 were drawn whatever its size)."""
    from hppctl.zoo import get_model
    from hppctl.zoo.build import vocab_size

    return min(1000, vocab_size(get_model(model)))


SYNTHETIC_CLASS_SHARE = 0.75
"""Token models: the share of positions after the first that hold a token of the class's slice (the
rest are uniform over every id, so the class's slice dominates whichever way the model pools)."""
SYNTHETIC_NOISE = 2.0
"""Image and feature models: the standard deviation of the noise added to the class prototype (the
prototypes have unit variance per element)."""
_CHUNK = 256
"""Samples written at a time: building a large model's inputs needs no second full-size tensor."""


def _synthetic(shape: tuple[int, ...], dtype: torch.dtype, classes: int, token_ids: int) -> Split:
    """Balanced, learnable samples (see the module docstring). The labels issue 25 found from the old
    random linear rule were skewed: 98.4 % one class on bert-small, 67.4 % on tiny-bert."""
    gen = torch.Generator().manual_seed(_DATA_SEED)
    y = balanced_labels(SYNTHETIC_SAMPLES, classes, gen)
    if dtype == torch.long:
        x = _class_tokens(y, shape, classes, token_ids, gen)
    else:
        x = _class_prototypes(y, shape, classes, gen)
    return Split(x, y)


def balanced_labels(n: int, classes: int, gen: torch.Generator) -> torch.Tensor:
    """n labels, each class ⌊n/C⌋ or ⌈n/C⌉ times, in a random order."""
    return (torch.arange(n) % classes)[torch.randperm(n, generator=gen)]


def _class_tokens(y: torch.Tensor, shape: tuple[int, ...], classes: int, token_ids: int,
                  gen: torch.Generator) -> torch.Tensor:
    """Token ids where the label's slice of [0, token_ids) is planted at position 0 and dominates the rest."""
    if token_ids < classes:
        raise BadInput(f"--dataset synthetic: the model's {token_ids} token ids cannot give each of its "
                       f"{classes} classes a token of its own")
    width = token_ids // classes  # class c owns ids [c·width, (c+1)·width)
    n = y.shape[0]
    x = torch.randint(0, token_ids, (n, *shape), generator=gen)
    flat = x.reshape(n, -1)
    own = y[:, None] * width + torch.randint(0, width, flat.shape, generator=gen)
    planted = torch.rand(flat.shape, generator=gen) < SYNTHETIC_CLASS_SHARE
    planted[:, 0] = True
    flat[planted] = own[planted]
    return x


def _class_prototypes(y: torch.Tensor, shape: tuple[int, ...], classes: int, gen: torch.Generator) -> torch.Tensor:
    """Each sample is its class's prototype plus noise. An image prototype is a random 4×4 pattern per
    channel stretched bilinearly over H×W: smooth, so convolutions and pooling keep it at any size."""
    import torch.nn.functional as F

    if len(shape) == 3:
        coarse = torch.randn((classes, shape[0], 4, 4), generator=gen)
        prototypes = F.interpolate(coarse, size=shape[1:], mode="bilinear", align_corners=False)
        prototypes = prototypes / prototypes.std(dim=(1, 2, 3), keepdim=True)  # unit variance as stated
    else:
        prototypes = torch.randn((classes, *shape), generator=gen)
    x = torch.randn((y.shape[0], *shape), generator=gen)
    for lo in range(0, y.shape[0], _CHUNK):
        x[lo:lo + _CHUNK].mul_(SYNTHETIC_NOISE).add_(prototypes[y[lo:lo + _CHUNK]])
    return x


@lru_cache(maxsize=1)
def _digits_raw() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits, read straight from the CSV it ships (what `load_digits` parses): importing
    sklearn.datasets would pull scipy and some 60 MB into every head and tail worker."""
    import gzip
    import importlib.util

    import numpy as np

    spec = importlib.util.find_spec("sklearn")
    path = os.path.join(os.path.dirname(spec.origin), "datasets", "data", "digits.csv.gz") if spec and spec.origin else ""
    if os.path.exists(path):
        with gzip.open(path) as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.float64)
        pixels, target = table[:, :-1].reshape(-1, 8, 8), table[:, -1]
    else:  # a scikit-learn that keeps the file elsewhere
        from sklearn.datasets import load_digits

        bunch = load_digits()
        pixels, target = bunch.images, bunch.target
    images = torch.tensor(pixels, dtype=torch.float32) / 16.0 * 2.0 - 1.0
    return images, torch.tensor(target, dtype=torch.long)


def _digits(shape: tuple[int, ...], dtype: torch.dtype, model: str) -> tuple[Split, Split]:
    if dtype != torch.float32:
        raise BadInput(f"--dataset digits: model {model!r} takes token ids; digits needs an image or feature model")
    images, labels = _digits_raw()
    x = resize_images(images, shape)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(_DATA_SEED))
    n_test = int(round(len(labels) * DIGITS_TEST_FRACTION))
    test, train = order[:n_test], order[n_test:]
    return Split(x[train], labels[train]), Split(x[test], labels[test])


def resize_images(images: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """(N, 8, 8) grey images to (N, *shape): (C, H, W) images or (D,) feature vectors."""
    import torch.nn.functional as F

    n = images.shape[0]
    if len(shape) == 3:
        c, h, w = shape
        x = images[:, None]
        if (h, w) != tuple(images.shape[1:]):
            x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)
        return x.expand(n, c, h, w).contiguous()
    if len(shape) == 1:
        flat = images.reshape(n, 1, -1)
        if flat.shape[-1] != shape[0]:
            flat = F.interpolate(flat, size=shape[0], mode="linear", align_corners=False)
        return flat.reshape(n, shape[0]).contiguous()
    raise BadInput(f"--dataset digits: cannot shape 8x8 images into the model input {tuple(shape)}")


def _user(path: str, shape: tuple[int, ...], classes: int) -> Data:
    from hppctl.zoo.user import import_factory

    factory = import_factory(path, "--dataset")  # --workdir first, then the current directory (models too)
    train, test = _call_factory(path, factory)
    data = Data(path, Split(None, None, train), Split(None, None, test) if test is not None else None, classes)
    x, y = _first_sample(path, data.train)
    if tuple(x.shape[1:]) != tuple(shape):
        raise BadInput(f"--dataset {path}: samples have shape {tuple(x.shape[1:])}, the model takes {tuple(shape)}")
    if not 0 <= int(y[0]) < classes:
        raise BadInput(f"--dataset {path}: label {int(y[0])} is outside the model's {classes} classes")
    return data


def _call_factory(path: str, factory) -> tuple[Any, Any]:
    """(train, test or None) from a `module:factory` the user named. `os:system` was a TypeError
    traceback and `os:getcwd` a string taken for a dataset: a factory is a Python function or class
    called with no arguments that returns dataset-like objects; anything it raises is one line."""
    from hppctl.zoo.user import call_factory

    made = call_factory(path, factory, "--dataset", "dataset", "a Dataset")
    train, test = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    for split in (train, test):
        if split is not None and not _dataset_like(split):
            raise BadInput(f"--dataset {path}: factory must return a Dataset or a (train, test) pair of them, "
                           f"got {type(made).__name__}")
    return train, test


def _dataset_like(obj: Any) -> bool:
    """A torch Dataset, or a sized sequence of samples; not text, bytes or a mapping, which have a
    length and items too."""
    from collections.abc import Mapping

    if isinstance(obj, (str, bytes, bytearray, Mapping)):
        return False
    return hasattr(obj, "__len__") and hasattr(obj, "__getitem__")


def _first_sample(path: str, split: Split) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample 0 as the workers will read it: an empty dataset or a sample that is not an
    (input, label) pair of numbers is one line, not an IndexError or TypeError traceback."""
    try:
        if len(split) < 1:
            raise BadInput(f"--dataset {path}: the training set is empty")
        return split.take(torch.tensor([0]))
    except BadInput:
        raise
    except Exception as e:  # noqa: BLE001 - the user's dataset
        raise BadInput(f"--dataset {path}: cannot read sample 0 as an (input, label) pair: "
                       f"{e.__class__.__name__}: {str(e)[:200]}") from None


class SampleOrder:
    """Which training sample sits at each (round, micro-batch, index) position; see the module docstring."""

    def __init__(self, num_samples: int, global_batch: int, micro_batch: int, seed: int) -> None:
        if num_samples < global_batch:
            raise BadInput(f"the dataset has {num_samples} training samples, fewer than the global batch {global_batch}")
        self.num_samples, self.global_batch, self.micro_batch, self.seed = num_samples, global_batch, micro_batch, seed
        self.rounds_per_epoch = num_samples // global_batch
        self._cache: tuple[int, torch.Tensor] | None = None

    def epoch_of(self, round_index: int) -> int:
        return round_index // self.rounds_per_epoch

    def permutation(self, epoch: int) -> torch.Tensor:
        if self._cache is None or self._cache[0] != epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._cache = (epoch, torch.randperm(self.num_samples, generator=gen))
        return self._cache[1]

    def indices(self, round_index: int, micro_batch: int, lo: int, hi: int) -> torch.Tensor:
        """Dataset indices of samples [lo, hi) of micro-batch `micro_batch` in round `round_index`."""
        perm = self.permutation(self.epoch_of(round_index))
        base = (round_index % self.rounds_per_epoch) * self.global_batch + micro_batch * self.micro_batch
        return perm[base + lo:base + hi]
