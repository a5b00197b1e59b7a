"""Checks of flags that several commands share, so that each refuses bad values with the same line.

Numbers: `nan` and `inf` are refused like -1. A non-finite value passed `value <= 0` and reached
pydantic (a traceback, exit 1), torch (`--lr inf` trained a model into NaN without a word) or `int()`
(`--timeout inf`: OverflowError). Counts, seconds, threads and seeds also have upper bounds (and
seconds a lower one): `--timeout 1e-300` ended in a torch DistNetworkError traceback (a store that
gives up after 0 ms), `--threads 1e9` failed inside every worker, and a seed past 2^32 overflows
torch's generator once the worker mixes in the round. The bounds are in each flag's help."""

from __future__ import annotations

import math

from hppctl.errors import BadInput

MAX_COUNT = 10**9
"""Rounds, epochs, samples, repeats: beyond, no run finishes, and int64 arithmetic gets close."""
MAX_THREADS = 1024
"""torch threads per worker or probe: more than any edge device (or this machine) has cores."""
MAX_SEED = 2**32 - 1
MIN_TIMEOUT_S = 1.0
"""Joining a store, a transfer, an SSH probe: nothing completes in less (0 ms: a DistNetworkError)."""
MIN_PERIOD_S = 0.01
"""Heartbeats and probe answers: a 10 ms floor keeps them from flooding the network and the log."""
MAX_SECONDS = 30 * 86400.0
"""30 days: beyond, `datetime.timedelta` and torch's millisecond timeouts overflow."""


def positive(flag: str, value, allow_zero: bool = False, high: int = MAX_COUNT):
    """`value` itself (None passes: an unset optional flag), or BadInput naming the flag. Whole
    numbers must also be at most `high`."""
    if value is None:
        return value
    finite = not isinstance(value, float) or math.isfinite(value)
    if not finite or value < 0 or (value == 0 and not allow_zero):
        raise BadInput(f"{flag}: must be a {'non-negative' if allow_zero else 'positive'} finite number (got {value})")
    if isinstance(value, int) and value > high:
        raise BadInput(f"{flag}: must be at most {high:,} (got {_shown(value)})")
    return value


def seconds(flag: str, value, low: float = MIN_TIMEOUT_S, high: float = MAX_SECONDS):
    """A time flag within [low, high] seconds (None passes), or BadInput naming the flag and the bounds."""
    if value is None:
        return value
    if not (isinstance(value, (int, float)) and math.isfinite(value) and low <= value <= high):
        raise BadInput(f"{flag}: must be a number of seconds from {_bound(low)} to {_bound(high)} (got {_shown(value)})")
    return value


def threads(flag: str, value):
    """torch threads: 1 to MAX_THREADS (None passes: the command's default)."""
    positive(flag, value)
    if value is not None and value > MAX_THREADS:
        raise BadInput(f"{flag}: must be at most {MAX_THREADS} threads (got {_shown(value)})")
    return value


def seed(flag: str, value: int) -> int:
    if not 0 <= value <= MAX_SEED:
        raise BadInput(f"{flag}: must be from 0 to {MAX_SEED} (got {_shown(value)})")
    return value


def _bound(x: float) -> str:
    """2592000, not 2.592e+06; 0.01 as it is."""
    return str(int(x)) if x == int(x) else f"{x:g}"


def _shown(value) -> str:
    """A flag's value as an error line quotes it, cut short (an int flag may have thousands of digits)."""
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_optimizer_flags(optimizer: str | None, lr: float | None, momentum: float | None, weight_decay: float | None) -> None:
    """The optimizer's flags (`hppctl run`, `hppctl coordinator`, `hppctl psl run`): left to TrainOptions, a negative
    --momentum or --weight-decay printed pydantic's traceback and exit 1. None: not given (the model
    family's default, runtime/optimizer_defaults.py)."""
    if optimizer not in (None, "sgd", "adam"):
        raise BadInput(f"--optimizer: unknown value {optimizer!r} (sgd or adam)")
    positive("--lr", lr)
    positive("--momentum", momentum, allow_zero=True)
    positive("--weight-decay", weight_decay, allow_zero=True)


MAX_DIVERGENCE_FACTOR = 1e9


def divergence_factor(flag: str, value: float) -> float:
    """`--divergence-factor`: 0 (the check off) or a finite factor above 1 (at most 1 the check
    would stop a run on ordinary noise); runtime/divergence.py."""
    if not (value == 0 or (math.isfinite(value) and 1 < value <= MAX_DIVERGENCE_FACTOR)):
        raise BadInput(f"{flag}: must be 0 (off) or above 1, at most {_bound(MAX_DIVERGENCE_FACTOR)} (got {_shown(value)})")
    return value


PRECISIONS = ("fp32", "fp16", "bf16")


def precision(flag: str, value: str) -> str:
    """`--precision`: fp32 (default, no autocast), fp16 or bf16 (runtime/accelerator.py)."""
    if value not in PRECISIONS:
        raise BadInput(f"{flag}: unknown value {_shown(value)!r} ({', '.join(PRECISIONS)})")
    return value

WORKDIR_HELP = ("Your code: a directory shipped to every device of the run over SSH (cached there by content "
                "hash: unchanged, it is not sent again), first on the workers' import path, for --dataset "
                "module:fn. At most 64 MiB. Default: none.")
"""`--workdir` of `run`, `psl run` and `coordinator` (runtime/workdir.py; docs/runtime.md "Your code: --workdir")."""

INPUT_SHAPE_HELP = ("A model of your own (--model package.module:factory) without an example input: the shape of "
                    "one sample, e.g. 3x224x224 (docs/zoo.md, \"Your own model\").")
INPUT_DTYPE_HELP = "With --input-shape: float32 (default) or int64 (token ids)."


def model_input(model: str | None, shape: str | None, dtype: str | None):
    """`--input-shape`/`--input-dtype`: checked, refused on a built-in model, and declared for this
    process (zoo/user.py), so that resolving `model` uses them. The parsed ModelInput or None."""
    from hppctl.zoo.user import check_no_input_flags, declare_input, parse_input

    parsed = parse_input(shape, dtype)
    if model is None and parsed is not None:
        raise BadInput("--input-shape: says what one sample of a model of your own is; name the model too")
    if model is not None:
        check_no_input_flags(model, parsed)
        declare_input(model, parsed)
    return parsed


def check_extension_flags(*, rounds, more_rounds, resume, epochs=None, more_epochs=None, schedule=None) -> None:
    """`--more-rounds`/`--more-epochs` count past the checkpoint's newest round: they need --resume and
    replace --rounds/--epochs (totals), and an asynchronous schedule counts in epochs (`hppctl run`;
    `hppctl psl run` has rounds only)."""
    given = [f for f, v in (("--more-rounds", more_rounds), ("--more-epochs", more_epochs)) if v is not None]
    if not given:
        return
    flag = given[0]
    if len(given) > 1:
        raise BadInput("--more-rounds and --more-epochs: give one of them")
    positive(flag, more_rounds if more_rounds is not None else more_epochs)
    for total_flag, value in (("--rounds", rounds), ("--epochs", epochs)):
        if value is not None:
            raise BadInput(f"{flag}: counts past the checkpoint's newest round; {total_flag} gives the total "
                           f"instead: give one of them")
    if not resume:
        raise BadInput(f"{flag}: goes with --resume and --checkpoint-dir (it counts past the newest round there)")
    if schedule is not None and more_rounds is not None:
        raise BadInput(f"--more-rounds: --schedule {schedule} trains whole epochs; use --more-epochs")


def check_checkpoint_flags(checkpoint_dir, checkpoint_every: int, resume: bool) -> None:
    """--resume and a --checkpoint-every of its own need --checkpoint-dir (the latter was ignored without a word)."""
    if checkpoint_dir is None:
        for flag, given in (("--resume", resume), ("--checkpoint-every", checkpoint_every != 1)):
            if given:
                raise BadInput(f"{flag}: needs --checkpoint-dir")
