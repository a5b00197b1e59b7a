"""Building zoo models as torch modules: Hugging Face architectures from their configs, tiny test models.

Nothing is ever downloaded: `HF_HUB_OFFLINE=1` is set before `transformers` is imported, built-in models
get random weights, and `hf:PATH` loads only from the local directory.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from hppctl.errors import BadInput  # noqa: E402
from hppctl.zoo.init import reinitialise  # noqa: E402
from hppctl.zoo.spec import USER_FAMILY, ModelDescription  # noqa: E402


class ZooModule(nn.Module):
    """Uniform wrapper: `forward(x)` takes the model input (pixel values, token ids or features) and
    returns one tensor, the logits (or the last hidden state for headless checkpoints)."""

    def __init__(self, spec: ModelDescription, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.zoo_name = spec.name
        # Hugging Face models take a keyword argument; the tiny and the user's models take the tensor positionally.
        keywords = {"image": "pixel_values", "tokens": "input_ids"}
        positional = spec.family.startswith("tiny-") or spec.family == USER_FAMILY
        self.keyword = None if positional else keywords[spec.input_kind]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.keyword is None:
            return self.model(x)
        out = self.model(**{self.keyword: x})
        logits = getattr(out, "logits", None)
        return logits if logits is not None else out.last_hidden_state


def build_module(spec: ModelDescription, *, weights: bool = False, device: str = "cpu", seed: int = 0) -> ZooModule:
    torch_device = torch.device(device)
    if spec.family.startswith("tiny-"):
        from hppctl.zoo import tiny

        cls = getattr(tiny, spec.head_class)
        with torch.device(torch_device):
            torch.manual_seed(seed)
            return ZooModule(spec, cls(**spec.config))

    import transformers

    model_cls = getattr(transformers, spec.head_class)
    if spec.hf_path is not None:
        config_cls = getattr(transformers, spec.family_info.config_class)
        try:
            config = config_cls.from_pretrained(spec.hf_path, local_files_only=True)
        except (OSError, ValueError, TypeError) as e:
            raise BadInput(f"{spec.name}: cannot read its config ({e})") from None
    else:
        config = getattr(transformers, spec.family_info.config_class)(**spec.config)
    # Eager attention is plain matmul/softmax: traceable, and its FLOPs and activations are explicit.
    config._attn_implementation = "eager"
    if hasattr(config, "use_cache"):
        config.use_cache = False

    if weights and spec.hf_path is not None:
        if torch_device.type == "meta":
            raise ValueError("weights=True needs a real device, not meta")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = model_cls.from_pretrained(spec.hf_path, config=config, local_files_only=True)
        except (OSError, ValueError) as e:
            raise BadInput(f"{spec.name}: cannot load weights ({e})") from None
        return ZooModule(spec, model.to(torch_device))

    torch.manual_seed(seed)
    with torch.device(torch_device), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_cls(config)
        if torch_device.type != "meta":  # meta tensors hold no values to initialise
            reinitialise(spec.family, model)
    return ZooModule(spec, model)


def example_input(spec: ModelDescription, batch_size: int, *, device: str = "cpu", seed: int = 0) -> torch.Tensor:
    """A deterministic batch of the model's input (random pixels, features or token ids)."""
    shape = (batch_size, *spec.input_shape)
    if device == "meta":
        dtype = torch.long if spec.input_kind == "tokens" else torch.float32
        return torch.zeros(shape, dtype=dtype, device="meta")
    gen = torch.Generator().manual_seed(seed)
    if spec.input_kind == "tokens":
        vocab = vocab_size(spec)
        return torch.randint(0, vocab, shape, generator=gen).to(device)
    return torch.randn(shape, generator=gen).to(device)


def vocab_size(spec: ModelDescription) -> int:
    """How many token ids the model's embedding takes (token models only)."""
    if spec.family == USER_FAMILY:
        return int(getattr(spec, "vocab", 0))  # zoo/user.py read it from the module
    if spec.hf_path is not None:
        import json
        from pathlib import Path

        config = json.loads((Path(spec.hf_path) / "config.json").read_text())
        return int(config.get("vocab_size", 1000))
    if "vocab_size" in spec.config:
        return int(spec.config["vocab_size"])
    import transformers

    return int(getattr(transformers, spec.family_info.config_class)().vocab_size)


def parameter_count(module: Any) -> int:
    """Distinct parameters (tied weights once), as `nn.Module.parameters()` yields them."""
    return sum(p.numel() for p in module.parameters())
