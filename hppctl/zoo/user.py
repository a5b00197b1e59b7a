"""A model of the user's own: `--model package.module:factory` (docs/zoo.md, "Your own model").

`factory()` returns a `torch.nn.Module`, or `(module, example_input)` where `example_input` is a
batch (any size) of the model's input. Without one, the per-sample input comes from, in order: what
the run declared (`--input-shape`/`--input-dtype`, or the `model_input` a profile, plan or worker
config records; `declare_input`), the module's `example_input` attribute (a batch), or its
`input_shape` attribute (per sample, with an optional `input_dtype`). The spec is a `ModelSpec` of
family `user`: tracing, layer tables, stages, profiles, plans and runs take it as they take a zoo
model. Its fingerprint covers the source of the factory's module and of the module's class, so an
edited model is traced again rather than read from the layer-table cache.

`import_factory` is the one place a `module:attribute` reference (a model's, or `--dataset`'s) is
imported (through hppctl/usercode.py: the run's `--workdir` first, then the current directory, as
for `python -m`); `call_factory` the one place such a factory is called.

Torch is imported inside functions only: `get_model` (the catalog) stays torch-free for zoo names.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import sysconfig
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hppctl import usercode
from hppctl.errors import BadInput, shorten
from hppctl.models.profile import ModelInput
from hppctl.zoo.spec import USER_BLOCK_PATTERN as BLOCK_PATTERN, USER_FAMILY, ZOO_VERSION, InputKind, ModelDescription


_REF = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
DTYPES = ("float32", "int64")
MODEL_FLAG = "--model"

_DECLARED: dict[str, ModelInput] = {}
_SPECS: dict[tuple[str, str], "UserModelSpec"] = {}


def is_user_ref(name: str) -> bool:
    """`package.module:factory` (a zoo name has no colon; `hf:PATH` is a checkpoint)."""
    return ":" in name and not name.startswith("hf:")


# --- the one resolver of `module:attribute` references (models and datasets) ---------------------------

def import_factory(ref: str, flag: str) -> Any:
    """The object `ref` (`package.module:attribute`) names, imported from the run's `--workdir` first,
    then the current directory (hppctl/usercode.py, the one import root); anything that goes wrong is
    one `BadInput` line naming `flag` and `ref`."""
    module_name, _, attribute = ref.partition(":")
    try:
        target: Any = usercode.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except Exception as e:  # noqa: BLE001 - the user's module: a SyntaxError or a failing import line too
        raise BadInput(f"{flag}: cannot import {ref!r} ({e.__class__.__name__}: {shorten(str(e), 200)})") from None
    return target


def call_factory(ref: str, factory: Any, flag: str, what: str, returns: str) -> Any:
    """`factory()`, the factory a user named with `flag`: a Python function or class called with no
    arguments (`os:system` was a TypeError traceback, `os:abort` would kill the CLI); anything it
    raises is one line. `what` names the kind ("dataset"), `returns` what it should return."""
    if not callable(factory) or inspect.isbuiltin(factory):
        raise BadInput(f"{flag} {ref}: not a {what} factory (a Python function or class returning {returns})")
    try:
        inspect.signature(factory).bind()
    except TypeError:
        raise BadInput(f"{flag} {ref}: a {what} factory is called with no arguments; this one needs some") from None
    except ValueError:
        pass  # no signature to read (some classes): calling it tells
    try:
        return factory()
    except Exception as e:  # noqa: BLE001 - the user's code: any failure is their model's or dataset's
        raise BadInput(f"{flag} {ref}: the factory failed: {e.__class__.__name__}: {str(e)[:200]}") from None


# --- input specs -------------------------------------------------------------------------------------

def parse_input(shape: str | None, dtype: str | None, flag: str = "--input-shape") -> ModelInput | None:
    """`3x224x224` and `float32` -> ModelInput; None when neither flag is given."""
    if shape is None:
        if dtype is not None:
            raise BadInput("--input-dtype: goes with --input-shape (the shape of one sample, e.g. 3x224x224)")
        return None
    if dtype is not None and dtype not in DTYPES:
        raise BadInput(f"--input-dtype: unknown value {dtype!r} (float32 or int64)")
    parts = shape.lower().split("x")
    if not all(p.strip().isdigit() and int(p) > 0 for p in parts) or not 1 <= len(parts) <= 8:
        raise BadInput(f"{flag}: {shorten(repr(shape))} is not a per-sample shape such as 3x224x224 "
                       "(1 to 8 positive whole numbers joined by x)")
    if any(int(p) > 10**9 for p in parts):
        raise BadInput(f"{flag}: {shorten(repr(shape))}: a dimension above 10^9")
    return ModelInput(shape=[int(p) for p in parts], dtype=dtype or "float32")  # type: ignore[arg-type]


def declare_input(ref: str, model_input: ModelInput | None) -> None:
    """What one sample of `ref` is, for this process: from the flags, or from the profile, plan or
    worker config that recorded it. A zoo name or None changes nothing."""
    if model_input is not None and is_user_ref(ref):
        _DECLARED[ref] = model_input


def declared_input(ref: str) -> ModelInput | None:
    return _DECLARED.get(ref)


def check_no_input_flags(model: str, model_input: ModelInput | None) -> None:
    """`--input-shape` names a user model's input; a zoo model's name already says it."""
    if model_input is not None and not is_user_ref(model):
        raise BadInput(f"--input-shape: only for a model of your own (--model package.module:factory); "
                       f"the built-in {model} has its input (see `hppctl models`)")


# --- the spec ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class UserModelSpec(ModelDescription):
    """A user model: `name` is its reference; `input_shape` and `dtype` one sample. It has the
    `build` and `example_input` of a catalog `ModelSpec` (their own, not the zoo's builders)."""

    dtype: Literal["float32", "int64"] = "float32"
    source_sha256: str = ""
    """Of the factory's module file and the module class's file: an edit re-traces the model."""
    vocab: int = 0
    """Token models (int64 input): the ids its first embedding takes (synthetic data draws from them)."""

    @property
    def input_kind(self) -> InputKind:
        if self.dtype == "int64":
            return "tokens"
        return "image" if len(self.input_shape) == 3 else "features"

    @property
    def input_dtype(self) -> str:
        return self.dtype

    @property
    def model_input(self) -> ModelInput:
        return ModelInput(shape=list(self.input_shape), dtype=self.dtype)

    def fingerprint(self) -> str:
        doc = {"zoo_version": ZOO_VERSION, "family": USER_FAMILY, "ref": self.name, "input": list(self.input_shape),
               "dtype": self.dtype, "source": self.source_sha256}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def build(self, *, weights: bool = False, device: str = "cpu", seed: int = 0) -> Any:
        """The module the factory returns, inside hppctl's wrapper (its names get `model.` in front).
        Its weights are the factory's, drawn after `torch.manual_seed(seed)`."""
        return build_user_module(self, device=device, seed=seed)

    def example_input(self, batch_size: int = 1, *, device: str = "cpu", seed: int = 0) -> Any:
        import torch

        shape = (batch_size, *self.input_shape)
        if device == "meta":
            return torch.zeros(shape, dtype=getattr(torch, self.dtype), device="meta")
        gen = torch.Generator().manual_seed(seed)
        if self.dtype == "int64":
            return torch.randint(0, max(1, self.vocab), shape, generator=gen).to(device)
        return torch.randn(shape, generator=gen).to(device)


def user_spec(ref: str) -> UserModelSpec:
    """The spec of `ref` (cached per process and declared input): imports and calls the factory once."""
    if not _REF.fullmatch(ref):
        raise BadInput(f"{MODEL_FLAG}: {shorten(repr(ref))} is not a model of your own in the form "
                       "package.module:factory (nor a built-in name; see `hppctl models`)")
    declared = _DECLARED.get(ref)
    key = (ref, declared.model_dump_json() if declared is not None else "")
    if key not in _SPECS:
        _SPECS[key] = _resolve(ref, declared)
    return _SPECS[key]


def _resolve(ref: str, declared: ModelInput | None) -> UserModelSpec:
    import torch

    factory = import_factory(ref, MODEL_FLAG)
    with torch.random.fork_rng(devices=[]):  # looking at the model leaves the caller's random state alone
        torch.manual_seed(0)
        module, example = _module_of(ref, call_factory(ref, factory, MODEL_FLAG, "model", "a torch.nn.Module"))
    model_input = declared or _input_of(ref, module, example)
    vocab = _vocabulary(ref, module) if model_input.dtype == "int64" else 0
    return UserModelSpec(name=ref, task="train", family=USER_FAMILY, input_shape=tuple(model_input.shape),
                         description=f"{type(module).__name__} from {ref}", dtype=model_input.dtype,
                         source_sha256=_source_digest(factory, module), vocab=vocab)


def _module_of(ref: str, made: Any) -> tuple[Any, Any]:
    """(module, example batch or None) from what the factory returned."""
    import torch

    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        module, example = made
        if not isinstance(example, torch.Tensor):
            raise BadInput(f"{MODEL_FLAG} {ref}: the factory's example input is a {type(example).__name__}, "
                           "not a tensor (a batch of the model's input)")
        return module, example
    if isinstance(made, torch.nn.Module):
        return made, None
    raise BadInput(f"{MODEL_FLAG} {ref}: the factory must return a torch.nn.Module or (module, example_input), "
                   f"got {type(made).__name__}")


def _input_of(ref: str, module: Any, example: Any) -> ModelInput:
    """The per-sample input from the factory's example, or the module's documented attributes."""
    import torch

    example = example if example is not None else getattr(module, "example_input", None)
    if isinstance(example, torch.Tensor):
        if example.dim() < 2:
            raise BadInput(f"{MODEL_FLAG} {ref}: the example input has shape {tuple(example.shape)}; it is a "
                           "batch, so its first dimension is the batch (e.g. torch.randn(1, 3, 32, 32))")
        dtype = str(example.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise BadInput(f"{MODEL_FLAG} {ref}: the example input is {dtype}; hppctl feeds float32 or int64 inputs")
        return ModelInput(shape=list(example.shape[1:]), dtype=dtype)  # type: ignore[arg-type]
    shape = getattr(module, "input_shape", None)
    if shape is not None:
        dtype = getattr(module, "input_dtype", "float32")
        dtype = str(dtype).removeprefix("torch.")
        sized = isinstance(shape, (tuple, list, torch.Size)) and len(shape) > 0
        if not (sized and all(isinstance(d, int) and d > 0 for d in shape)):
            raise BadInput(f"{MODEL_FLAG} {ref}: its input_shape {shorten(repr(shape))} is not a tuple of "
                           "positive ints (one sample, e.g. (3, 32, 32))")
        if dtype not in DTYPES:
            raise BadInput(f"{MODEL_FLAG} {ref}: its input_dtype {dtype!r} is not float32 or int64")
        return ModelInput(shape=list(shape), dtype=dtype)  # type: ignore[arg-type]
    raise BadInput(f"{MODEL_FLAG} {ref}: no input shape: give --input-shape (one sample, e.g. 3x224x224), "
                   "return (module, example_input) from the factory, or set module.input_shape")


def _vocabulary(ref: str, module: Any) -> int:
    import torch

    vocab = getattr(module, "vocab_size", None)
    if isinstance(vocab, int) and vocab > 0:
        return vocab
    embedding = next((m for m in module.modules() if isinstance(m, torch.nn.Embedding)), None)
    if embedding is None:
        raise BadInput(f"{MODEL_FLAG} {ref}: int64 input but no nn.Embedding and no vocab_size attribute "
                       "to say which ids it takes")
    return int(embedding.num_embeddings)


def _source_digest(factory: Any, module: Any) -> str:
    """sha256 over the source files of the factory's module and of the module's class, each named by
    its dotted module name, not its path: a device imports the same file from its copy of the
    `--workdir` (another directory), and must find the same fingerprint as the launcher."""
    files: dict[str, str] = {}
    for obj in (factory, type(module)):
        try:
            path = inspect.getsourcefile(obj)
        except TypeError:
            path = None
        if path:
            files[obj.__module__] = str(Path(path).resolve())
    digest = hashlib.sha256()
    for name, path in sorted(files.items()):
        try:
            digest.update(name.encode() + b"\0" + Path(path).read_bytes())
        except OSError:
            digest.update(name.encode())
    return digest.hexdigest()[:16]


# --- building and tracing (torch side) -----------------------------------------------------------------

def build_user_module(spec: UserModelSpec, *, device: str = "cpu", seed: int = 0) -> Any:
    import torch

    from hppctl.zoo.build import ZooModule

    factory = import_factory(spec.name, MODEL_FLAG)
    torch.manual_seed(seed)
    if device == "meta":
        try:  # parameters on the meta device: no memory, as for zoo models
            with torch.device("meta"):
                made = factory()
        except Exception:  # noqa: BLE001 - a factory that cannot build on meta (it loads a file): build, then move
            torch.manual_seed(seed)
            made = call_factory(spec.name, factory, MODEL_FLAG, "model", "a torch.nn.Module")
        module = _module_of(spec.name, made)[0].to("meta")
    else:
        made = call_factory(spec.name, factory, MODEL_FLAG, "model", "a torch.nn.Module")
        module = _module_of(spec.name, made)[0].to(device)
    return ZooModule(spec, module)


def block_leaves(module: Any, qualname: str) -> bool:
    """Top-level blocks traced as single calls (the `--granularity block` fallback)."""
    return re.fullmatch(BLOCK_PATTERN, qualname) is not None


def untraceable(spec: ModelDescription, error: BaseException, *, blocks_traced: bool) -> str:
    """One line: where tracing `spec` stopped (the deepest frame of the user's code) and what to do.
    An error that is not tracing's (a layer refusing the input's shape) says so instead."""
    if not _is_trace_error(error):
        return user_model_failure(spec, error)
    where = _user_frame(error)
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    message = message.split(" (%")[0]  # the fx node dump after it says nothing the user's line does not
    cause = f"{error.__class__.__name__}: {shorten(message, 160)}" if message else error.__class__.__name__
    if blocks_traced:
        advice = ("use --granularity block (each top-level child one layer), or wrap the call "
                  "with torch.fx.wrap")
    else:
        advice = ("wrap the call with torch.fx.wrap (or move it into a submodule); its forward must be traceable "
                  "by torch.fx even at --granularity block")
    return f"{MODEL_FLAG} {spec.name}: cannot be traced into layers at {where} ({cause}); {advice}"


def _user_frame(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    skip = tuple(str(Path(p).resolve()) for p in _library_dirs())
    for frame in reversed(frames):
        path = str(Path(frame.filename).resolve())
        if not path.startswith(skip) and not frame.filename.startswith("<"):
            line = (frame.line or "").strip()
            return f"{Path(frame.filename).name}:{frame.lineno}" + (f" `{shorten(line, 100)}`" if line else "")
    return "the model's forward"


def _library_dirs() -> list[str]:
    import torch

    import hppctl

    dirs = [os.path.dirname(torch.__file__), os.path.dirname(hppctl.__file__)]
    for key in ("stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.append(path)
    return dirs


def user_model_failure(spec: ModelDescription, error: BaseException) -> str:
    """One line for a user model that failed on the meta device outside tracing proper (its output is
    not a batch of logits, a layer refusing the input's shape, ...)."""
    where = _user_frame(error)
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    shape = "x".join(map(str, spec.input_shape))
    return (f"{MODEL_FLAG} {spec.name}: the model fails on a batch of its input ({shape} "
            f"{getattr(spec, 'dtype', 'float32')} per sample) at {where} ({error.__class__.__name__}: "
            f"{shorten(message, 200)}); check --input-shape or the factory's example input")


def _is_trace_error(error: BaseException) -> bool:
    """torch.fx's own refusals, and ops that need tensor values (meta tensors have none)."""
    from torch.fx.proxy import TraceError

    return isinstance(error, (TraceError, NotImplementedError)) or "meta" in str(error).lower()


def recorded_input(name: str) -> ModelInput | None:
    """What a profile, plan or worker config records beside `name`: a user model's resolved input
    spec (declared, the factory's example, or the module's attributes); None for a zoo model."""
    return user_spec(name).model_input if is_user_ref(name) else None


def refuse_inference(name: str) -> None:
    """Collaborative inference (Galaxy) splits transformer layers by heads, MLP columns and sequence
    rows: it needs the zoo's transformer layouts, which a user module does not declare."""
    if is_user_ref(name):
        raise BadInput(f"{MODEL_FLAG} {name}: collaborative inference (--seq-len; strategies galaxy, megatron, sp, "
                       "local) needs a built-in or hf: transformer, whose attention and MLP layouts it splits; "
                       "a model of your own trains with `hppctl run` (docs/zoo.md)")
