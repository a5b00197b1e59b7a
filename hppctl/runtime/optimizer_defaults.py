"""The optimizer a training run uses when its command line names none, per model family.

Until issue 25 every run defaulted to SGD, lr 0.05, momentum 0.9: it diverged on mobilenetv2 (loss
10.7 after 3 epochs of digits) and resnet50, and did not move vgg-mini off chance (7.0 %). The
defaults below are the best of `python bench/defaults.py` (the table and the command in
docs/runtime.md, "Default optimizer"): Adam at a rate per family, constant (a cosine schedule did not help at these budgets, and a constant
rate lets `--resume` continue a run for more rounds).

`resolve` fills the settings a command line leaves out: from the checkpoint's record when resuming
(a run written with the old default keeps it, with a note), else from the model family's default.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from hppctl.errors import BadInput

SGD_LR = 0.05
"""`--optimizer sgd` without `--lr`: the rate SGD had as the default before (with momentum 0.9)."""
SGD_MOMENTUM = 0.9


@dataclass(frozen=True)
class FamilyDefault:
    optimizer: str
    lr: float
    family: str
    """How the default names the models it is for (printed)."""


TINY = FamilyDefault("adam", 0.02, "the tiny test models")
CNN = FamilyDefault("adam", 0.001, "CNNs")
TRANSFORMER = FamilyDefault("adam", 0.0003, "transformers")
TINY_FAMILIES = ("tiny-mlp", "tiny-cnn")
"""Models of a few thousand parameters: Adam's per-parameter steps must be larger to move them."""


@dataclass(frozen=True)
class OptimizerSettings:
    optimizer: str
    lr: float
    momentum: float
    weight_decay: float
    lr_schedule: str
    warmup_rounds: int
    source: str
    """Where the settings not given came from: a sentence for the user."""

    def describe(self) -> str:
        text = f"{self.optimizer} lr {self.lr:g}"
        if self.optimizer == "sgd":
            text += f" momentum {self.momentum:g}"
        if self.weight_decay:
            text += f" weight decay {self.weight_decay:g}"
        if self.lr_schedule != "constant":
            text += f" {self.lr_schedule}"
        if self.warmup_rounds:
            text += f" ({self.warmup_rounds} warm-up rounds)"
        return text

    def line(self) -> str | None:
        """What a run prints on stderr before it starts, or None when the optimizer and rate were given."""
        if self.source == "as given":
            return None
        if self.source.startswith("default"):
            return f"optimizer: {self.describe()} ({self.source}; --optimizer/--lr to change)"
        return f"optimizer: {self.describe()} ({self.source}: a resumed run keeps its optimizer)"

    def as_options(self) -> dict:
        """The `TrainOptions` fields."""
        return {"optimizer": self.optimizer, "lr": self.lr, "momentum": self.momentum,
                "weight_decay": self.weight_decay, "lr_schedule": self.lr_schedule, "warmup_rounds": self.warmup_rounds}


def family_default(model: str) -> FamilyDefault:
    """The default for `model` (a built-in name or `hf:` path): by its family, else by its input."""
    from hppctl.zoo import get_model

    spec = get_model(model)
    if spec.family in TINY_FAMILIES:
        return TINY
    return TRANSFORMER if spec.input_kind == "tokens" else CNN


def resolve(model: str, *, optimizer: str | None = None, lr: float | None = None, momentum: float | None = None,
            weight_decay: float | None = None, lr_schedule: str | None = None, warmup_rounds: int | None = None,
            recorded: dict | None = None) -> OptimizerSettings:
    """The run's optimizer settings: those given (not None), the rest from `recorded` (a checkpoint's
    COMPLETE.json when resuming; its settings then win over the family default, so a checkpoint
    written under another default continues as it was trained), else the family's default.
    `--optimizer sgd` alone gets SGD's own rate (0.05, momentum 0.9), not the Adam default's."""
    given = {"optimizer": optimizer, "lr": lr, "momentum": momentum, "weight_decay": weight_decay,
             "lr_schedule": lr_schedule, "warmup_rounds": warmup_rounds}
    if recorded is not None and "optimizer" in recorded:
        base = _recorded_settings(recorded)
        source = f"as recorded in {recorded.get('_file', 'the checkpoint')}"
    else:
        default = family_default(model)
        chosen = optimizer or default.optimizer
        base = {"optimizer": chosen, "lr": default.lr if chosen == default.optimizer else SGD_LR,
                "momentum": SGD_MOMENTUM, "weight_decay": 0.0, "lr_schedule": "constant", "warmup_rounds": 0}
        source = f"default for {default.family}"
    settings = {k: (v if v is not None else base[k]) for k, v in given.items()}
    # momentum, weight decay and warm-up have one default whatever the family: worth a line only
    # when the optimizer or its rate was chosen for the user
    return OptimizerSettings(**settings, source=source if optimizer is None or lr is None else "as given")


def _recorded_settings(meta: dict) -> dict:
    """A COMPLETE.json's optimizer settings (runtime/session.py `run_fingerprint`), checked: `BadInput`
    naming the file and the field for one no run writes (a missing `lr` was a KeyError traceback)."""
    def bad(field: str, what: str) -> BadInput:
        from hppctl.runtime.checkpoint import short_repr

        return BadInput(f"--resume: {meta.get('_file', 'the checkpoint')}: {field}: {what} "
                        f"(got {short_repr(meta.get(field))})")

    def number(field: str, default: float | None, *, positive: bool) -> float:
        value = meta.get(field, default)
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        try:
            number = float(value) if numeric else math.nan
        except OverflowError:  # a JSON integer past float's range
            number = math.inf
        if not math.isfinite(number) or number < 0 or (positive and number == 0):
            raise bad(field, f"must be a {'positive' if positive else 'non-negative'} finite number")
        return number

    if meta["optimizer"] not in ("sgd", "adam"):
        raise bad("optimizer", "must be sgd or adam")
    if not (meta.get("lr_schedule") is None or isinstance(meta["lr_schedule"], str)):
        raise bad("lr_schedule", "must be text or null")
    schedule, warmup = _parse_schedule(meta.get("lr_schedule"))
    return {"optimizer": meta["optimizer"], "lr": number("lr", None, positive=True),
            "momentum": number("momentum", SGD_MOMENTUM, positive=False),
            "weight_decay": number("weight_decay", 0.0, positive=False), "lr_schedule": schedule, "warmup_rounds": warmup}


def _parse_schedule(text: str | None) -> tuple[str, int]:
    """("constant" | "cosine", warm-up rounds) from the record's text: None (constant, no warm-up),
    or "cosine, 44 rounds, 5 warm-up rounds" and the like (`session._schedule_text`)."""
    if not text:
        return "constant", 0
    kind = "cosine" if text.startswith("cosine") else "constant"
    warm = re.search(r"(\d+) warm-up rounds", text)
    return kind, int(warm.group(1)) if warm else 0


def recorded_settings(checkpoint_dir) -> dict | None:
    """The newest complete round's COMPLETE.json in `checkpoint_dir` (None: no round yet), for
    `resolve(recorded=...)` on `--resume`."""
    from hppctl.runtime.checkpoint import CheckpointDir

    return CheckpointDir(checkpoint_dir).newest_meta()
