"""How long `--dataset FOLDER` and `--dataset F.csv` take to read: decoded or parsed, then from the cache.

    python bench/dataset_cache.py          # 1000 JPEGs of 256x256 in 10 classes, to 3x32x32; a CSV of 100000 x 33
    python bench/dataset_cache.py --images 3000 --size 64 --format png --rows 20000

Writes the folder into a temporary directory (the cache too: `HPPCTL_CACHE_DIR`), then times
`runtime/datasets.load_file_dataset` twice in fresh interpreters: the first decodes every file (parses
the CSV) and writes the cache, the second finds the cache (it still reads and hashes every file: that
is the key).
The figures in docs/runtime.md ("Your data") come from the first command.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TIMED = """
import sys, time, torch
import hppctl.zoo  # imported by every run before the dataset: not part of the timing
from hppctl.runtime.datasets import load_file_dataset
t = time.perf_counter()
d = load_file_dataset(sys.argv[1], (3, 32, 32) if sys.argv[1].endswith("images") else (32,), torch.float32, 10)
print(f"{len(d.train_labels) + len(d.test_labels)} {time.perf_counter() - t:.2f}")
"""


def write_folder(root: Path, images: int, size: int, fmt: str) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(images):
        folder = root / f"class{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        coarse = rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)  # smooth pictures, as photos are
        picture = Image.fromarray(coarse).resize((size, size), Image.Resampling.BILINEAR)
        picture.save(folder / f"{i:05d}.{fmt}", **({"quality": 90} if fmt == "jpg" else {}))


def write_csv(path: Path, rows: int) -> None:
    """32 feature columns and a label, as repr of float32 values (what a pandas export writes)."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 32)).astype(np.float32)
    lines = [",".join([f"f{i}" for i in range(32)] + ["label"])]
    lines += [",".join([repr(float(v)) for v in row] + [str(i % 10)]) for i, row in enumerate(x)]
    path.write_text("\n".join(lines) + "\n")


def timed_load(root: Path, env: dict) -> tuple[int, float]:
    out = subprocess.run([sys.executable, "-c", TIMED, str(root)], env=env, check=True, capture_output=True,
                         text=True).stdout.split()
    return int(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--format", choices=("jpg", "png"), default="jpg")
    parser.add_argument("--rows", type=int, default=100000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "images"
        write_folder(root, args.images, args.size, args.format)
        megabytes = sum(f.stat().st_size for f in root.rglob("*")) / 1e6
        env = {**os.environ, "HPPCTL_CACHE_DIR": str(Path(tmp) / "cache"),
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                              os.environ.get("PYTHONPATH", "")])}
        n, first = timed_load(root, env)
        _, second = timed_load(root, env)
        print(f"{n} {args.format} images {args.size}x{args.size} ({megabytes:.1f} MB) to 3x32x32: "
              f"decoded {first:.2f} s, from the cache {second:.2f} s")
        table = Path(tmp) / "table.csv"
        write_csv(table, args.rows)
        n, first = timed_load(table, env)
        _, second = timed_load(table, env)
        print(f"{n} CSV rows of 33 columns ({table.stat().st_size / 1e6:.1f} MB): parsed {first:.2f} s, "
              f"from the cache {second:.2f} s")


if __name__ == "__main__":
    main()
