"""Small datasets written into a test's folder: a folder of PNG/JPEG images, .pt, .npz and .csv files
(for tests/runtime/test_datasets*.py)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

CLASSES = ("circle", "cross", "stripes")


def class_image(label: int, variant: int, size: tuple[int, int] = (12, 10)) -> np.ndarray:
    """An 8-bit RGB picture of class `label` (a shape drawn from tensors), varied by `variant`."""
    h, w = size
    gen = torch.Generator().manual_seed(100 * label + variant)
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    if label == 0:
        shape = ((yy - h / 2) ** 2 + (xx - w / 2) ** 2 < (min(h, w) / 3) ** 2).float()
    elif label == 1:
        shape = ((yy - xx).abs() < 2).float() + ((yy + xx - w).abs() < 2).float()
    else:
        shape = (yy % 4 < 2).float()
    noise = torch.rand((h, w, 3), generator=gen) * 60
    pixels = shape[..., None] * 180 + noise
    return pixels.clamp(0, 255).to(torch.uint8).numpy()


def image_folder(root: Path, per_class: int = 12) -> Path:
    """One sub-folder per class; mostly RGB PNGs, some grey JPEGs (converted to the model's channels)."""
    from PIL import Image

    for label, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            picture = Image.fromarray(class_image(label, i))
            if i % 4 == 3:
                picture.convert("L").save(root / name / f"{i:02d}.jpg", quality=95)
            else:
                picture.save(root / name / f"{i:02d}.png")
    return root


def png_bytes(array: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def features(n: int = 60, dims: int = 32, classes: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Feature vectors whose class shifts their mean (learnable), float32, and int64 labels."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    rng.shuffle(y)
    centres = rng.normal(size=(classes, dims))
    x = (centres[y] + 0.5 * rng.normal(size=(n, dims))).astype(np.float32)
    return x, y.astype(np.int64)


def write_csv(path: Path, x: np.ndarray, y: np.ndarray, label_at: int | None = None) -> Path:
    """Header f0..f{D-1} with a `label` column at `label_at` (default: last); values as repr (exact)."""
    names = [f"f{i}" for i in range(x.shape[1])]
    at = len(names) if label_at is None else label_at
    lines = [",".join(names[:at] + ["label"] + names[at:])]
    for row, label in zip(x.tolist(), y.tolist()):
        cells = [repr(v) for v in row]
        lines.append(",".join(cells[:at] + [str(label)] + cells[at:]))
    path.write_text("\n".join(lines) + "\n")
    return path
