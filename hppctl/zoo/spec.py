"""What a zoo model is, as pure data: its architecture family and its description (`ModelDescription`).

A leaf of `hppctl.zoo`: the torch side (`zoo/build.py`) builds from a `ModelDescription` and the
catalog (`zoo/catalog.py`) subclasses it as `ModelSpec`, whose `build`/`example_input` call the torch
side, so build.py never imports the catalog back. Importing it never imports torch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

Task = Literal["train", "inference"]
InputKind = Literal["image", "tokens", "features"]

USER_FAMILY = "user"
USER_BLOCK_PATTERN = r"model\.[^.]+(?:\.[^.]+)?"
"""A user model's block: a top-level child of the user's module (`model.<child>` inside hppctl's
wrapper), or an element of a top-level `ModuleList`/`ModuleDict` (`model.<child>.<n>`: a container is
never called itself). The fx module stack lists outer modules first, so a called child wins over its
own children."""

ZOO_VERSION = 1
"""Bump when tracing, grouping or cost rules change: it invalidates every cached layer table."""


@dataclass(frozen=True)
class Family:
    """How to build and how to cut one architecture family."""

    name: str
    config_class: str
    """Class name in `transformers` (empty for the tiny models)."""
    default_model_class: str
    model_classes: tuple[str, ...]
    """Head classes accepted from an `hf:` checkpoint's `architectures` field."""
    block_pattern: str
    """Regex (full match) on a module's qualified name inside the zoo wrapper: the module is one block."""
    input_kind: InputKind


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "mobilenet_v2",
            "MobileNetV2Config",
            "MobileNetV2ForImageClassification",
            ("MobileNetV2ForImageClassification", "MobileNetV2Model"),
            r"model\.(?:mobilenet_v2\.)?layer\.\d+",
            "image",
        ),
        Family(
            "efficientnet",
            "EfficientNetConfig",
            "EfficientNetForImageClassification",
            ("EfficientNetForImageClassification", "EfficientNetModel"),
            r"model\.(?:efficientnet\.)?encoder\.blocks\.\d+",
            "image",
        ),
        Family(
            "resnet",
            "ResNetConfig",
            "ResNetForImageClassification",
            ("ResNetForImageClassification", "ResNetModel"),
            r"model\.(?:resnet\.)?encoder\.stages\.\d+\.layers\.\d+",
            "image",
        ),
        Family(
            "bert",
            "BertConfig",
            "BertForSequenceClassification",
            ("BertForSequenceClassification", "BertForMaskedLM", "BertForPreTraining", "BertModel"),
            r"model\.(?:bert\.)?encoder\.layer\.\d+",
            "tokens",
        ),
        Family(
            "distilbert",
            "DistilBertConfig",
            "DistilBertForSequenceClassification",
            ("DistilBertForSequenceClassification", "DistilBertForMaskedLM", "DistilBertModel"),
            r"model\.(?:distilbert\.)?transformer\.layer\.\d+",
            "tokens",
        ),
        Family(
            "gpt2",
            "GPT2Config",
            "GPT2LMHeadModel",
            ("GPT2LMHeadModel", "GPT2Model", "GPT2ForSequenceClassification"),
            r"model\.(?:transformer\.)?h\.\d+",
            "tokens",
        ),
        Family(
            "opt",
            "OPTConfig",
            "OPTForCausalLM",
            ("OPTForCausalLM", "OPTModel", "OPTForSequenceClassification"),
            r"model\.(?:model\.)?decoder\.layers\.\d+",
            "tokens",
        ),
        Family("tiny-mlp", "", "TinyMLP", ("TinyMLP",), r"model\.blocks\.\d+", "features"),
        Family("tiny-cnn", "", "TinyCNN", ("TinyCNN",), r"model\.blocks\.\d+", "image"),
        Family("tiny-vgg", "", "TinyVGG", ("TinyVGG",), r"model\.blocks\.\d+", "image"),
        # `--model package.module:factory` (zoo/user.py); its spec says the input kind
        Family(USER_FAMILY, "", "", (), USER_BLOCK_PATTERN, "features"),
    )
}


@dataclass(frozen=True)
class ModelDescription:
    """What to build: an architecture, its configuration and the per-sample input it is costed for.
    Pure data; `catalog.ModelSpec` adds the torch-side `build` and `example_input`."""

    name: str
    task: Task
    family: str
    input_shape: tuple[int, ...]
    """Per-sample input shape: C×H×W for images, (sequence length,) for token ids, (features,) for MLPs."""
    description: str
    config: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the family's config class (or of the tiny model's constructor)."""
    model_class: str = ""
    """Head class; empty means the family default."""
    hf_path: str | None = None
    """Local checkpoint directory for `hf:` specs."""

    @property
    def family_info(self) -> Family:
        return FAMILIES[self.family]

    @property
    def input_kind(self) -> InputKind:
        return self.family_info.input_kind

    @property
    def input_dtype(self) -> str:
        return "int64" if self.input_kind == "tokens" else "float32"

    @property
    def head_class(self) -> str:
        return self.model_class or self.family_info.default_model_class

    @property
    def trace_mode(self) -> Literal["train", "eval"]:
        """Mode the layer table is traced in: training models keep their dropout in the graph."""
        return "train" if self.task == "train" else "eval"

    def fingerprint(self) -> str:
        """Changes whenever anything that shapes the layer table changes, including the installed
        transformers (its modeling code decides the graph, hence the layer indices stages use)."""
        doc = {
            "zoo_version": ZOO_VERSION,
            "transformers": None if self.family.startswith("tiny-") else transformers_version(),
            "task": self.task,
            "family": self.family,
            "input": list(self.input_shape),
            "config": self.config,
            "class": self.head_class,
        }
        text = json.dumps(doc, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@lru_cache(maxsize=1)
def transformers_version() -> str:
    try:
        return version("transformers")
    except PackageNotFoundError:
        return "missing"
