"""Datasets read from files, no code to write (`--dataset PATH`; docs/runtime.md "Your data").

- a folder of images, one sub-folder per class: class index = position of the sub-folder's name in
  the sorted names; the PNG and JPEG files under each (sub-folders included, sorted by path) are
  decoded with Pillow, converted to the model's channels (1: grey "L", 3: "RGB"), resized to its
  H×W (Pillow's bilinear filter, integer arithmetic on 8-bit pixels) and scaled to [-1, 1];
- `.pt`: `torch.save((inputs, labels), path)`, read with `torch.load(weights_only=True)` (a file
  that needs pickle to load is refused: opening a dataset must not run code);
- `.npz`: arrays `x` (inputs) and `y` (labels), read with `allow_pickle=False`;
- `.csv`: a header row, then one sample per row; every cell a number; the label column is the last
  one, or `--label-column NAME`; the other columns, in file order, fill the model's input row-major.

Every sample is checked before any worker starts (the launcher's pre-flight loads the dataset as the
workers will): the model's input shape, finite values, integer labels within the model's classes.
A problem is one `BadInput` line naming the file, the sample (row, column) and what is wrong.

The split is fixed and the same for every format: a sample is a test sample when the SHA-256 of its
key (its path inside a folder, `cat/07.png`; its 0-based index in a file) is 0 modulo 5, about
20 % (`in_test_split`); both splits keep file order. It does not depend on `--seed` or on N, so
appending samples moves none of the others across. The training order is the run's `SampleOrder` over the training split, as
for the built-in datasets.

Decoding a folder of images and parsing a CSV are the slow parts, so their results are cached in
`$HPPCTL_CACHE_DIR/datasets/<key>.pt` (default `~/.cache/hppctl/datasets/`). A folder's key is a
SHA-256 over every image file's relative path, class and bytes, the model's (C, H, W), the decoder
version and Pillow's version (`decoded_images_cache`); a CSV's over its bytes and the parser version.
Any change to a file's bytes, a file or class added, removed or renamed, another input size or
another Pillow gives another key, so the data is decoded again; stale entries are never read
(delete the folder to reclaim the space).

This module does not import `runtime/data.py` (which dispatches here): it returns tensors.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from hppctl.errors import BadInput, HppctlError

TEST_ONE_IN = 5
"""A sample is in the test split when the SHA-256 of its key is 0 modulo this (about 20 %)."""
SPLIT_SALT = "hppctl split v1 "
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
FILE_SUFFIXES = (".pt", ".npz", ".csv")
LABEL_MARK = "#label="
"""`--label-column NAME` joins the dataset's name as `PATH#label=NAME`: the run's dataset is one string
everywhere (worker options, the checkpoint's record, the summary), so a resume with another label
column is refused like one with another dataset."""
DECODER_VERSION = 1
"""Part of the cache key: raise it when the decoding below changes what a file turns into."""
_CHANNEL_MODES = {1: "L", 3: "RGB"}


@dataclass(frozen=True)
class FileDataset:
    """Inputs shaped for the model and int64 labels, split into training and test samples."""

    train_inputs: torch.Tensor
    train_labels: torch.Tensor
    test_inputs: torch.Tensor | None
    test_labels: torch.Tensor | None


# --- naming ---------------------------------------------------------------------------------------

def dataset_spec(dataset: str, label_column: str | None) -> str:
    """The run's dataset string for `--dataset D [--label-column NAME]`."""
    if label_column is None:
        return dataset
    if not label_column.strip():
        raise BadInput("--label-column: must name a column of the CSV file (got an empty name)")
    if LABEL_MARK in dataset:
        raise BadInput(f"--dataset {dataset}: already names a label column ({LABEL_MARK}…); drop --label-column")
    if not dataset.lower().endswith(".csv"):
        raise BadInput(f"--label-column: only for a CSV dataset (--dataset {dataset})")
    return f"{dataset}{LABEL_MARK}{label_column}"


def split_spec(spec: str) -> tuple[str, str | None]:
    """(path, label column or None) of a dataset string from `dataset_spec`."""
    path, mark, column = spec.rpartition(LABEL_MARK)
    return (path, column) if mark else (spec, None)


def is_file_dataset(spec: str) -> bool:
    """A path rather than a built-in name or `package.module:factory`: it exists, has a dataset
    suffix, or holds a path separator (a module name never does)."""
    path, column = split_spec(spec)
    return (column is not None or os.path.exists(path) or path.lower().endswith(FILE_SUFFIXES)
            or os.sep in path)


def load_file_dataset(spec: str, shape: Sequence[int], dtype: torch.dtype, classes: int,
                      vocabulary: int | None = None) -> FileDataset:
    """The dataset at `spec`'s path, checked against the model (input `shape` and `dtype`, `classes`
    labels, token ids below `vocabulary` when known), split train/test; `BadInput` if it does not fit."""
    path, column = split_spec(spec)
    if column is not None and not path.lower().endswith(".csv"):
        raise BadInput(f"--label-column: only for a CSV dataset (--dataset {path})")
    if not os.path.exists(path):
        raise BadInput(f"--dataset {path}: no such file or folder")
    shape = tuple(int(s) for s in shape)
    keys = None  # a folder's samples are keyed by path; a file's by index (below)
    if os.path.isdir(path):
        x, y, keys = _image_folder(path, shape, dtype, classes)
    elif path.lower().endswith(".pt"):
        x, y = _torch_file(path)
    elif path.lower().endswith(".npz"):
        x, y = _npz_file(path)
    elif path.lower().endswith(".csv"):
        x, y = _csv_file(path, column, shape, classes)
    else:
        raise BadInput(f"--dataset {path}: not a dataset (a folder of class sub-folders of images, or a .pt, .npz "
                       f"or .csv file)")
    x = _model_inputs(path, x, shape, dtype, vocabulary)
    y = _labels(path, y, x.shape[0], classes)
    return _split(x, y, keys if keys is not None else [str(i) for i in range(x.shape[0])])


def in_test_split(key: str) -> bool:
    """Whether the sample with this key (its path in a folder, its 0-based index in a file) is a test
    sample. A function of the key alone, not of N or of a random stream: the same on every machine and
    torch version, and a sample stays on its side when files are added to a folder or rows appended
    to a file (a scheduled retraining never trains on last week's test samples)."""
    digest = hashlib.sha256((SPLIT_SALT + key).encode()).digest()
    return int.from_bytes(digest[:8], "big") % TEST_ONE_IN == 0


def _split(x: torch.Tensor, y: torch.Tensor, keys: list[str]) -> FileDataset:
    """Test: the samples whose key `in_test_split`; both splits in file order."""
    mask = torch.tensor([in_test_split(k) for k in keys], dtype=torch.bool)
    train, test = (~mask).nonzero().flatten(), mask.nonzero().flatten()
    if test.numel() == 0:
        return FileDataset(x[train], y[train], None, None)
    return FileDataset(x[train], y[train], x[test], y[test])


# --- checks shared by every format ----------------------------------------------------------------

def _model_inputs(path: str, x: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype,
                  vocabulary: int | None) -> torch.Tensor:
    """`x` as the model's input: (N, *shape), float32 (finite) or int64 token ids."""
    if x.dim() == 0:
        raise BadInput(f"--dataset {path}: the inputs are a single number, not samples")
    if x.shape[0] == 0:
        raise BadInput(f"--dataset {path}: holds no samples")
    if tuple(x.shape[1:]) != shape:
        raise BadInput(f"--dataset {path}: samples have shape {_dims(x.shape[1:])}, the model takes {_dims(shape)}")
    if x.dtype == torch.bool or x.is_complex():
        raise BadInput(f"--dataset {path}: inputs are {str(x.dtype).removeprefix('torch.')}, not real numbers")
    if dtype == torch.long:
        return _token_ids(path, x, vocabulary)
    x = x.to(torch.float32)
    bad = ~torch.isfinite(x.reshape(x.shape[0], -1)).all(dim=1)
    if bad.any():  # float64 values beyond float32's range become inf here, and are refused too
        i = int(bad.nonzero()[0])
        raise BadInput(f"--dataset {path}: sample {i} holds NaN or infinity (as float32)")
    return x


def _token_ids(path: str, x: torch.Tensor, vocabulary: int | None) -> torch.Tensor:
    flat = x.reshape(x.shape[0], -1)
    if x.is_floating_point():
        bad = (flat != flat.round()) | ~torch.isfinite(flat)
        if bad.any():
            i = int(bad.any(dim=1).nonzero()[0])
            raise BadInput(f"--dataset {path}: sample {i}: the model takes token ids and this sample holds a value "
                           f"that is not an integer")
    high = vocabulary if vocabulary is not None else 2**62
    bad = (flat < 0) | (flat >= high)
    if bad.any():
        i = int(bad.any(dim=1).nonzero()[0])
        raise BadInput(f"--dataset {path}: sample {i} holds a token id outside 0..{high - 1} (the model's vocabulary)")
    return x.to(torch.long)


def _labels(path: str, y: torch.Tensor, n: int, classes: int) -> torch.Tensor:
    """int64 labels, one per sample, each in [0, classes)."""
    if y.dim() != 1:
        raise BadInput(f"--dataset {path}: labels have shape {_dims(y.shape)}; give one integer per sample ({n},)")
    if y.shape[0] != n:
        raise BadInput(f"--dataset {path}: {n} samples but {y.shape[0]} labels")
    if y.dtype == torch.bool or y.is_complex():
        raise BadInput(f"--dataset {path}: labels are {str(y.dtype).removeprefix('torch.')}, not integers")
    if y.is_floating_point():
        bad = ~torch.isfinite(y) | (y != y.round())
        if bad.any():
            i = int(bad.nonzero()[0])
            raise BadInput(f"--dataset {path}: label of sample {i} is {float(y[i])!r}, not an integer class index")
    out = (y < 0) | (y >= classes)
    if out.any():
        i = int(out.nonzero()[0])
        raise BadInput(f"--dataset {path}: label of sample {i} is {_number(y[i])}, outside the model's {classes} "
                       f"classes (0 to {classes - 1})")
    return y.to(torch.long)


def _dims(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _number(value: torch.Tensor) -> str:
    v = value.item()
    return str(int(v)) if float(v).is_integer() else repr(v)


# --- .pt and .npz ---------------------------------------------------------------------------------

def _torch_file(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    import pickle
    import warnings

    try:
        with warnings.catch_warnings():  # torch's note on a plain pickle's protocol would be a second line
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else e.__class__.__name__
        raise BadInput(f"--dataset {path}: needs pickle to load, refused (a dataset file must not run code: "
                       f"save plain tensors, torch.save((inputs, labels), f)): {first}") from None
    except Exception as e:  # noqa: BLE001 - any undecodable file: truncated zip, not a torch file
        raise BadInput(f"--dataset {path}: cannot read it as a torch file ({e.__class__.__name__}: "
                       f"{_first_line(e)})") from None
    if not (isinstance(obj, (tuple, list)) and len(obj) == 2 and all(isinstance(t, torch.Tensor) for t in obj)):
        raise BadInput(f"--dataset {path}: holds {_kind(obj)}, not an (inputs, labels) pair of tensors "
                       f"(torch.save((inputs, labels), f))")
    return obj[0], obj[1]


def _npz_file(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    import numpy as np

    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - not a zip, truncated
        raise BadInput(f"--dataset {path}: cannot read it as an .npz archive ({e.__class__.__name__}: "
                       f"{_first_line(e)})") from None
    if not hasattr(archive, "files"):  # np.load gave an ndarray: an .npy file under an .npz name
        raise BadInput(f"--dataset {path}: is a single .npy array, not an .npz archive of x and y (numpy.savez)")
    with archive:
        missing = [k for k in ("x", "y") if k not in archive.files]
        if missing:
            held = ", ".join(sorted(archive.files)) or "nothing"
            raise BadInput(f"--dataset {path}: has no array {missing[0]!r} (holds {held}); an .npz dataset holds "
                           f"x (inputs) and y (labels)")
        return _npz_array(path, archive, "x"), _npz_array(path, archive, "y")


def _npz_array(path: str, archive, key: str) -> torch.Tensor:
    import numpy as np

    try:
        array = archive[key]
    except ValueError as e:  # object arrays: allow_pickle=False refuses them
        raise BadInput(f"--dataset {path}: array {key!r} needs pickle to load, refused (store numbers: "
                       f"numpy.savez(f, x=..., y=...)): {_first_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - a damaged member
        raise BadInput(f"--dataset {path}: array {key!r} cannot be read ({e.__class__.__name__}: "
                       f"{_first_line(e)})") from None
    if array.dtype.kind not in "iufb":
        raise BadInput(f"--dataset {path}: array {key!r} holds {array.dtype} values, not numbers")
    if array.dtype.kind == "u" and array.dtype.itemsize > 1:
        array = array.astype(np.int64)  # torch has no uint16/32/64 arithmetic on every version
    return torch.from_numpy(np.ascontiguousarray(array))


def _kind(obj) -> str:
    if isinstance(obj, (tuple, list)):
        return f"a {type(obj).__name__} of {len(obj)} item(s)"
    return f"a {type(obj).__name__}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else "")[:200]


# --- CSV ------------------------------------------------------------------------------------------

def _csv_file(path: str, label_column: str | None, shape: tuple[int, ...],
              classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Numbers parsed by Python's `float` (correctly rounded: the same on every machine), from the
    cache when this file was parsed before; a bad cell is named by its line and column."""
    header, lines, table = _csv_table(path)
    label = _label_index(path, header, label_column)
    bad = ~torch.isfinite(table)
    if bad.any():
        r, c = (int(i) for i in bad.nonzero()[0])
        raise BadInput(f"--dataset {path}: line {int(lines[r])}, column {header[c]!r}: {float(table[r, c])} is not "
                       f"a finite number")
    y = table[:, label]
    _check_label_cells(path, header[label], y, lines, classes)
    x = torch.cat([table[:, :label], table[:, label + 1:]], dim=1)
    features = math.prod(shape)
    if x.shape[1] != features:
        raise BadInput(f"--dataset {path}: {x.shape[1]} feature columns (besides the label column "
                       f"{header[label]!r}); the model takes {_dims(shape)}, {features} values per sample")
    return x.reshape(x.shape[0], *shape), y


def _csv_table(path: str) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """(column names, each row's line number, float64 rows × columns): parsed once per content."""
    cache = _cache_path("csv v1", [(path, _file_sha256_or_refuse(path))])
    cached = _read_cache(cache)
    if cached is not None and isinstance(cached.get("header"), list) and _table_entry_ok(cached):
        return [str(h) for h in cached["header"]], cached["lines"], cached["table"]
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = next((row for row in reader if any(cell.strip() for cell in row)), None)
            if header is None:
                raise BadInput(f"--dataset {path}: is empty (a CSV dataset starts with a header row naming the columns)")
            header = [h.strip() for h in header]
            _check_header(path, header, reader.line_num)
            lines, rows = _csv_rows(path, reader, header)
    except UnicodeDecodeError as e:
        raise BadInput(f"--dataset {path}: is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except csv.Error as e:
        raise BadInput(f"--dataset {path}: not a readable CSV file ({e})") from None
    if not rows:
        raise BadInput(f"--dataset {path}: has a header and no rows")
    table, line_numbers = torch.tensor(rows, dtype=torch.float64), torch.tensor(lines, dtype=torch.long)
    _write_cache(cache, {"header": header, "lines": line_numbers, "table": table})
    return header, line_numbers, table


def _table_entry_ok(entry: dict) -> bool:
    table, lines = entry.get("table"), entry.get("lines")
    return (isinstance(table, torch.Tensor) and isinstance(lines, torch.Tensor) and table.dtype == torch.float64
            and table.dim() == 2 and table.shape == (lines.shape[0], len(entry["header"])))


def _check_header(path: str, header: list[str], line: int) -> None:
    if all(_is_number(n) for n in header if n):
        raise BadInput(f"--dataset {path}: line {line} holds numbers; a CSV dataset starts with a header row naming the "
                       f"columns")
    if len(header) < 2:
        raise BadInput(f"--dataset {path}: line {line} names {len(header)} column; a CSV dataset needs feature columns "
                       f"and a label column")


def _label_index(path: str, header: list[str], label_column: str | None) -> int:
    if label_column is None:
        return len(header) - 1
    found = [i for i, n in enumerate(header) if n == label_column.strip()]
    if not found:
        raise BadInput(f"--label-column: {label_column!r} is not a column of {path} (columns: "
                       f"{_shortened(', '.join(header))})")
    if len(found) > 1:
        raise BadInput(f"--label-column: {path} has {len(found)} columns named {label_column!r}")
    return found[0]


def _csv_rows(path: str, reader, header: list[str]) -> tuple[list[int], list[list[float]]]:
    """Each row's line number and numbers; a row converts in one `map` (a cell at a time only to name
    the one that is not a number)."""
    lines, rows = [], []
    width = len(header)
    for cells in reader:
        if not cells:
            continue  # a blank line (one at the end of the file is common)
        if len(cells) != width:
            raise BadInput(f"--dataset {path}: line {reader.line_num}: {len(cells)} cells, the header has {width}")
        try:
            rows.append(list(map(float, cells)))
        except ValueError:
            column, cell = next((header[i], c) for i, c in enumerate(cells) if not _is_number(c))
            raise BadInput(f"--dataset {path}: line {reader.line_num}, column {column!r}: {_shortened(cell)!r} is "
                           f"not a number") from None
        lines.append(reader.line_num)
    return lines, rows


def _check_label_cells(path: str, column: str, y: torch.Tensor, lines: torch.Tensor, classes: int) -> None:
    fractional = y != y.round()
    if fractional.any():
        r = int(fractional.nonzero()[0])
        raise BadInput(f"--dataset {path}: line {int(lines[r])}, column {column!r}: the label {float(y[r])!r} is not "
                       f"an integer class index")
    outside = (y < 0) | (y >= classes)
    if outside.any():
        r = int(outside.nonzero()[0])
        raise BadInput(f"--dataset {path}: line {int(lines[r])}, column {column!r}: the label {int(y[r])} is outside "
                       f"the model's {classes} classes (0 to {classes - 1})")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _shortened(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


# --- folders of images ----------------------------------------------------------------------------

def _image_folder(path: str, shape: tuple[int, ...], dtype: torch.dtype,
                  classes: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """(N, C, H, W) float images in [-1, 1], their class indices, and their split keys (the path
    inside the folder, `cat/07.png`), decoded once per content (cache)."""
    if dtype != torch.float32 or len(shape) != 3:
        raise BadInput(f"--dataset {path}: a folder of images needs a model that takes images (C×H×W); this one "
                       f"takes {'token ids' if dtype == torch.long else _dims(shape)}")
    if shape[0] not in _CHANNEL_MODES:
        raise BadInput(f"--dataset {path}: the model takes {shape[0]} channels; images convert to 1 (grey) or 3 "
                       f"(RGB): give a .pt or .npz file instead")
    names, files = image_files(path, classes)
    pixels, labels = decoded_images(path, files, shape)
    keys = [Path(os.path.relpath(f, path)).as_posix() for f, _ in files]
    return pixels.to(torch.float32) / 255.0 * 2.0 - 1.0, labels, keys


def image_files(path: str, classes: int | None = None) -> tuple[list[str], list[tuple[str, int]]]:
    """Class names (sorted sub-folder names) and (file, class index) in sorted order. Hidden entries
    (a leading dot: `.git`, `.DS_Store`) and files that are not .png/.jpg/.jpeg are left out. More
    class folders than the model's `classes` is refused before any is walked (`--dataset ~` by
    mistake must not read the whole home directory)."""
    try:
        names = sorted(e.name for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))
    except OSError as e:
        raise BadInput(f"--dataset {path}: cannot list the folder ({e.strerror or e})") from None
    if not names:
        raise BadInput(f"--dataset {path}: holds no class sub-folders (a folder of images has one sub-folder of "
                       f"images per class)")
    if classes is not None and len(names) > classes:
        raise BadInput(f"--dataset {path}: {len(names)} class folders ({_shortened(', '.join(names))}), more than "
                       f"the model's {classes} classes")
    files: list[tuple[str, int]] = []
    for index, name in enumerate(names):
        found = _images_under(os.path.join(path, name))
        if not found:
            raise BadInput(f"--dataset {os.path.join(path, name)}: class folder holds no PNG or JPEG image")
        files.extend((f, index) for f in found)
    return names, files


def _images_under(folder: str) -> list[str]:
    found = []
    for root, dirs, filenames in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(os.path.join(root, f) for f in filenames
                     if not f.startswith(".") and f.lower().endswith(IMAGE_SUFFIXES))
    return sorted(found, key=lambda f: os.path.relpath(f, folder).split(os.sep))


def decoded_images(path: str, files: list[tuple[str, int]], shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 (N, C, H, W) pixels and labels: from the cache when this content was decoded before."""
    pil = _pillow(path)
    cache = decoded_images_cache(path, files, shape, pil.__version__)
    cached = _cached_pixels(_read_cache(cache), len(files), shape)
    if cached is not None:
        return cached
    pixels = torch.empty((len(files), *shape), dtype=torch.uint8)
    for i, (file, _) in enumerate(files):
        pixels[i] = _decode(file, shape)
    labels = torch.tensor([label for _, label in files], dtype=torch.long)
    _write_cache(cache, {"pixels": pixels, "labels": labels})
    return pixels, labels


def _pillow(path: str):
    try:
        import PIL
        import PIL.Image  # noqa: F401 - the decoder itself
    except ImportError:
        raise BadInput(f"--dataset {path}: reading images needs Pillow, which is not installed here "
                       f"(pip install Pillow)") from None
    return PIL


def _decode(file: str, shape: tuple[int, ...]) -> torch.Tensor:
    """One image as uint8 (C, H, W). Pillow's conversions and bilinear resize work on 8-bit integers,
    so the pixels do not depend on the machine's floating point."""
    import warnings

    import numpy as np
    from PIL import Image

    c, h, w = shape
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow's DecompressionBombWarning would be a second line
            with Image.open(file, formats=["PNG", "JPEG"]) as im:
                im.load()
                if im.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
                    raise BadInput(f"--dataset {file}: a {im.mode} image (16-bit or float pixels); use 8-bit grey "
                                   f"or colour images")
                im = im.convert(_CHANNEL_MODES[c])
                if im.size != (w, h):
                    im = im.resize((w, h), Image.Resampling.BILINEAR)
                array = np.asarray(im, dtype=np.uint8)
    except BadInput:
        raise
    except Exception as e:  # noqa: BLE001 - corrupt, truncated, not an image, a decompression bomb
        raise BadInput(f"--dataset {file}: cannot decode the image ({e.__class__.__name__}: "
                       f"{_first_line(e)})") from None
    tensor = torch.from_numpy(array.copy())
    return tensor[None] if c == 1 else tensor.permute(2, 0, 1)


def decoded_images_cache(path: str, files: list[tuple[str, int]], shape: tuple[int, ...], pillow: str) -> Path:
    """Where the decoded folder is cached: its key covers everything the pixels depend on (module docstring)."""
    named = [(f"{label} {Path(os.path.relpath(file, path)).as_posix()}", _file_sha256_or_refuse(file))
             for file, label in files]
    return _cache_path(f"images v{DECODER_VERSION} pillow {pillow} shape {shape}", named)


def _cache_path(kind: str, named_digests: list[tuple[str, bytes]]) -> Path:
    """`$HPPCTL_CACHE_DIR/datasets/<key>.pt`, the key a SHA-256 over `kind` and each (name, content digest)."""
    from hppctl.zoo.cache import user_cache_dir

    digest = hashlib.sha256(f"hppctl {kind}\n".encode())
    for name, content in named_digests:
        digest.update(f"{name}\n".encode())
        digest.update(content)
    return user_cache_dir() / "datasets" / f"{digest.hexdigest()[:32]}.pt"


def _file_sha256_or_refuse(file: str) -> bytes:
    """The file's SHA-256 (hashlib.file_digest is Python 3.11+; hppctl runs on 3.10)."""
    digest = hashlib.sha256()
    try:
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as e:
        raise BadInput(f"--dataset {file}: cannot read it ({e.strerror or e})") from None
    return digest.digest()


def _read_cache(cache: Path) -> dict | None:
    """The cached entry, or None when absent or unreadable (then the caller decodes again and rewrites it)."""
    if not cache.is_file():
        return None
    try:
        entry = torch.load(cache, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - a damaged cache entry is decoded again and rewritten
        return None
    return entry if isinstance(entry, dict) else None


def _cached_pixels(entry: dict | None, n: int, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The entry's pixels and labels when they are what this key promises."""
    pixels, labels = (entry or {}).get("pixels"), (entry or {}).get("labels")
    if (isinstance(pixels, torch.Tensor) and isinstance(labels, torch.Tensor) and pixels.dtype == torch.uint8
            and tuple(pixels.shape) == (n, *shape) and tuple(labels.shape) == (n,)):
        return pixels, labels.to(torch.long)
    return None


def _write_cache(cache: Path, entry: dict) -> None:
    """Written through `store.atomic_output` (a temporary name, renamed; removed if writing fails), so a
    worker never reads half of it; a cache that cannot be written (read-only home) only costs decoding again."""
    from hppctl.store import atomic_output

    with contextlib.suppress(OSError, HppctlError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(cache) as f:
            torch.save(entry, f)
