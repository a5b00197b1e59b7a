"""The catalog of built-in models and `hf:PATH` specs. Pure data: importing it never imports torch.

A `ModelSpec` says which architecture to build (a Hugging Face config class and model class, or
one of the tiny test models), with which configuration, for which per-sample input: its data is a
`ModelDescription` (the leaf `zoo/spec.py`, with the families). Building the
module, tracing it and costing its layers live in the torch-side modules of `hppctl.zoo`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hppctl.errors import BadInput, UnknownModel, shorten
from hppctl.zoo.spec import FAMILIES, ModelDescription, Task
from hppctl.zoo.spec import ZOO_VERSION  # noqa: F401  (importable from the catalog, as before)

HF_MODEL_TYPES = {
    "mobilenet_v2": "mobilenet_v2",
    "efficientnet": "efficientnet",
    "resnet": "resnet",
    "bert": "bert",
    "distilbert": "distilbert",
    "gpt2": "gpt2",
    "opt": "opt",
}
"""`model_type` in a checkpoint's config.json -> family."""

DEFAULT_HF_SEQ_LEN = 128
"""Sequence length for `hf:` text models (capped by the model's maximum positions)."""


@dataclass(frozen=True)
class ModelSpec(ModelDescription):
    """A catalog entry: its description, and the torch-side helpers (imported on call, so that the
    catalog stays free of torch)."""

    # Torch-side helpers (imports happen inside).
    def build(self, *, weights: bool = False, device: str = "cpu", seed: int = 0) -> Any:
        """The model as a `ZooModule` (forward(x) -> logits). Random weights from `seed` unless
        `weights` asks for the `hf:` checkpoint's own. `device="meta"` allocates nothing."""
        from hppctl.zoo.build import build_module

        return build_module(self, weights=weights, device=device, seed=seed)

    def example_input(self, batch_size: int = 1, *, device: str = "cpu", seed: int = 0) -> Any:
        from hppctl.zoo.build import example_input

        return example_input(self, batch_size, device=device, seed=seed)


def _bert(layers: int, hidden: int, heads: int, *, vocab: int = 30522, max_pos: int = 512, labels: int = 2) -> dict[str, Any]:
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": 4 * hidden,
        "max_position_embeddings": max_pos,
        "num_labels": labels,
    }


BUILTINS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        # --- training (Asteroid §5.1, Table 4) ---
        ModelSpec(
            "mobilenetv2",
            "train",
            "mobilenet_v2",
            (3, 32, 32),
            "MobileNetV2 (width 1.0) for CIFAR-10: 32×32 input, 10 classes",
            {"depth_multiplier": 1.0, "image_size": 32, "num_labels": 10},
        ),
        ModelSpec(
            "efficientnet-b1",
            "train",
            "efficientnet",
            (3, 32, 32),
            "EfficientNet-B1 (width 1.0, depth 1.1) for CIFAR-10: 32×32 input, 10 classes",
            {
                "width_coefficient": 1.0,
                "depth_coefficient": 1.1,
                "hidden_dim": 1280,
                "dropout_rate": 0.2,
                "image_size": 32,
                "num_labels": 10,
            },
        ),
        ModelSpec(
            "resnet50",
            "train",
            "resnet",
            (3, 224, 224),
            "ResNet-50 for Mini-ImageNet: 224×224 input, 100 classes",
            {"depths": [3, 4, 6, 3], "layer_type": "bottleneck", "num_labels": 100},
        ),
        ModelSpec(
            "bert-small",
            "train",
            "bert",
            (32,),
            "BERT-small (4 layers, hidden 512, 8 heads), sequence classification on 32 tokens (Asteroid's 32×512 input)",
            _bert(4, 512, 8),
        ),
        # --- inference (Galaxy §V, Table I) ---
        ModelSpec(
            "distilbert",
            "inference",
            "distilbert",
            (284,),
            "DistilBERT-base (6 layers, hidden 768), sequence classification on 284 tokens",
            {"num_labels": 2},
        ),
        ModelSpec(
            "bert-large",
            "inference",
            "bert",
            (284,),
            "BERT-large (24 layers, hidden 1024, 16 heads), sequence classification on 284 tokens",
            _bert(24, 1024, 16),
        ),
        ModelSpec(
            "gpt2-large",
            "inference",
            "gpt2",
            (284,),
            "GPT-2 large (36 layers, hidden 1280, 20 heads), language-model logits on 284 tokens",
            {"n_embd": 1280, "n_layer": 36, "n_head": 20, "n_positions": 1024, "vocab_size": 50257},
        ),
        ModelSpec(
            "opt-1.3b",
            "inference",
            "opt",
            (284,),
            "OPT-1.3B (24 layers, hidden 2048, 32 heads), language-model logits on 284 tokens",
            {
                "hidden_size": 2048,
                "num_hidden_layers": 24,
                "num_attention_heads": 32,
                "ffn_dim": 8192,
                "word_embed_proj_dim": 2048,
                "max_position_embeddings": 2048,
                "vocab_size": 50272,
            },
        ),
        ModelSpec(
            "opt-2.7b",
            "inference",
            "opt",
            (284,),
            "OPT-2.7B (32 layers, hidden 2560, 32 heads), language-model logits on 284 tokens",
            {
                "hidden_size": 2560,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "ffn_dim": 10240,
                "word_embed_proj_dim": 2560,
                "max_position_embeddings": 2048,
                "vocab_size": 50272,
            },
        ),
        # --- small models for tests and smoke runs ---
        ModelSpec(
            "tiny-mlp",
            "train",
            "tiny-mlp",
            (32,),
            "2-block MLP (32 → 64 → 64 → 10) for tests",
            {"in_features": 32, "hidden": 64, "classes": 10, "blocks": 2},
        ),
        ModelSpec(
            "tiny-cnn",
            "train",
            "tiny-cnn",
            (3, 8, 8),
            "conv stem + one residual block + linear head (4 channels, 8×8 input, 10 classes) for tests",
            {"channels": 4, "classes": 10},
        ),
        ModelSpec(
            "vgg-mini",
            "train",
            "tiny-vgg",
            (3, 32, 32),
            "VGG-style CNN: 3 blocks of 2 conv (16/32/64 channels) + max-pool, 3 FC layers (256), 32×32 input",
            {"widths": [16, 32, 64], "fc": 256, "classes": 10},
        ),
        ModelSpec(
            "tiny-bert",
            "train",
            "bert",
            (16,),
            "2-layer BERT (hidden 64, 4 heads, vocabulary 1000), sequence classification on 16 tokens, for tests",
            _bert(2, 64, 4, vocab=1000, max_pos=64),
        ),
    )
}


def builtin_names() -> list[str]:
    return list(BUILTINS)


def get_model(name: str) -> ModelSpec:
    """The spec of a built-in model, of `hf:PATH` (a local Hugging Face checkpoint directory), or of
    `package.module:factory`, a model of the user's own (zoo/user.py: a `UserModelSpec`, which
    builds and gives example inputs as a `ModelSpec` does)."""
    if name.startswith("hf:"):
        return hf_spec(name[3:])
    from hppctl.zoo.user import is_user_ref, user_spec

    if is_user_ref(name):
        return user_spec(name)  # type: ignore[return-value]
    try:
        return BUILTINS[name]
    except KeyError:
        known = ", ".join(BUILTINS)
        raise UnknownModel(f"unknown model {shorten(repr(name))} (known: {known}, hf:PATH, or "
                           "package.module:factory for a model of your own)") from None


def hf_spec(path_text: str) -> ModelSpec:
    """Read `PATH/config.json` of a supported family; never touches the network."""
    if not path_text:
        raise BadInput("hf: needs a checkpoint directory, e.g. hf:./my-bert")
    path = Path(os.path.expanduser(path_text)).resolve()
    config_file = path / "config.json"
    if not path.is_dir():
        raise BadInput(f"hf:{path_text}: not a directory")
    if not config_file.is_file():
        raise BadInput(f"hf:{path_text}: no config.json in {path}")
    from hppctl.store import read_input_bytes

    raw = read_input_bytes(config_file)  # a regular file within the size limit, or one BadInput line
    try:
        config = json.loads(raw)
    except (ValueError, RecursionError) as e:  # RecursionError: nested thousands of levels deep
        raise BadInput(f"{config_file}: not readable JSON ({shorten(str(e) or e.__class__.__name__)})") from None
    if not isinstance(config, dict):
        raise BadInput(f"{config_file}: expected a JSON object")
    model_type = config.get("model_type")
    family_name = HF_MODEL_TYPES.get(str(model_type))
    if family_name is None:
        supported = ", ".join(sorted(HF_MODEL_TYPES))
        raise BadInput(f"{config_file}: model_type {model_type!r} is not supported (supported: {supported})")
    family = FAMILIES[family_name]
    architectures = config.get("architectures") or []
    head = next((a for a in architectures if a in family.model_classes), "")
    if architectures and not head:
        raise BadInput(
            f"{config_file}: architectures {architectures} has no supported head for {model_type} "
            f"(supported: {', '.join(family.model_classes)})"
        )
    if family.input_kind == "image":
        size = config.get("image_size", 224)
        channels = config.get("num_channels", 3)
        if not isinstance(size, int) or not isinstance(channels, int):
            raise BadInput(f"{config_file}: image_size and num_channels must be integers")
        shape: tuple[int, ...] = (channels, size, size)
        task: Task = "train"
    else:
        max_pos = config.get("max_position_embeddings") or config.get("n_positions") or DEFAULT_HF_SEQ_LEN
        shape = (min(DEFAULT_HF_SEQ_LEN, int(max_pos)),)
        task = "inference" if family_name in ("gpt2", "opt") else "train"
    # The fingerprint covers the whole config file, so that editing it invalidates cached tables.
    digest = hashlib.sha256(raw).hexdigest()[:12]
    return ModelSpec(
        name=f"hf:{path_text}",
        task=task,
        family=family_name,
        input_shape=shape,
        description=f"{head or family.default_model_class} from {path}",
        config={"config_sha256": digest},
        model_class=head,
        hf_path=str(path),
    )
