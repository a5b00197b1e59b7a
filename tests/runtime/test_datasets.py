"""`--dataset PATH` (runtime/datasets.py): folders of images, .pt, .npz and .csv files.

Pure tier: what a file turns into (split, order, channels, cache), and every malformed dataset
refused by `hppctl run`'s pre-flight: exit 2, one `error:` line naming the file (and row, sample or
column) and the problem, and no worker started (the launcher's first step towards workers,
`prepare_local_workers`, is replaced by a recorder; `test_a_good_dataset_reaches_the_workers`
shows the recorder sees a run that gets that far)."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch
import typer

from hppctl.runtime import datasets, launcher
from hppctl.runtime.data import SampleOrder, load_data
from hppctl.store import save
from tests.runtime.datasets_files import CLASSES, class_image, features, image_folder, png_bytes, write_csv
from tests.runtime.factories import local_cluster, make_plan


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HPPCTL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# --- what a file turns into -----------------------------------------------------------------------

def test_image_folder_classes_split_and_pixels(tmp_path):
    root = image_folder(tmp_path / "imgs", per_class=10)
    (root / "notes.txt").write_text("ignored: files beside the class folders")
    (root / ".hidden").mkdir()  # ignored: hidden entries
    (root / "cross" / "readme.md").write_text("ignored: not an image")
    data = load_data(str(root), "tiny-cnn")  # 3×8×8 input, 10 classes
    names, files = datasets.image_files(str(root))
    test = [datasets.in_test_split(os.path.relpath(f, root)) for f, _ in files]
    assert len(data.train) == 30 - sum(test) and len(data.test) == sum(test) > 0
    labels = torch.cat([data.train.labels, data.test.labels])
    assert sorted(labels.tolist()) == sorted([0] * 10 + [1] * 10 + [2] * 10)  # sorted folder names
    assert data.test.labels.tolist() == [label for (_, label), t in zip(files, test) if t]  # file order
    x = data.train.inputs
    assert x.shape == (len(data.train), 3, 8, 8) and x.dtype == torch.float32
    assert x.min() >= -1 and x.max() <= 1
    # grey JPEGs become three equal channels; RGB PNGs keep their colours
    grey = [i for i, img in enumerate(x) if torch.equal(img[0], img[1]) and torch.equal(img[1], img[2])]
    assert 0 < len(grey) < len(x)


def test_one_channel_models_get_grey_images(tmp_path):
    root = image_folder(tmp_path / "imgs", per_class=5)
    pixels, labels = datasets.decoded_images(str(root), datasets.image_files(str(root))[1], (1, 6, 6))
    assert pixels.shape == (15, 1, 6, 6) and pixels.dtype == torch.uint8
    assert labels.tolist() == [0] * 5 + [1] * 5 + [2] * 5


def test_the_split_is_fixed_and_the_order_is_the_runs(tmp_path):
    x, y = features(n=50)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    data = load_data(str(tmp_path / "d.npz"), "tiny-mlp")
    test = [i for i in range(50) if datasets.in_test_split(str(i))]
    train = [i for i in range(50) if i not in test]
    assert 5 <= len(test) <= 15  # about one in five
    assert torch.equal(data.test.inputs, torch.from_numpy(x)[test])
    assert torch.equal(data.train.labels, torch.from_numpy(y)[train])
    # training order: the run's (seed, epoch) permutation over the training split, as for digits
    a, b = SampleOrder(len(data.train), 8, 4, seed=3), SampleOrder(len(train), 8, 4, seed=3)
    assert torch.equal(a.indices(3, 1, 0, 4), b.indices(3, 1, 0, 4))
    assert torch.equal(load_data(str(tmp_path / "d.npz"), "tiny-mlp").train.inputs, data.train.inputs)


def test_appended_samples_move_no_other_across_the_split(tmp_path):
    # a growing dataset retrained on a schedule: last run's test samples must stay test samples
    x, y = features(n=80)
    np.savez(tmp_path / "small.npz", x=x[:50], y=y[:50])
    np.savez(tmp_path / "grown.npz", x=x, y=y)
    small, grown = load_data(str(tmp_path / "small.npz"), "tiny-mlp"), load_data(str(tmp_path / "grown.npz"), "tiny-mlp")
    assert torch.equal(grown.test.inputs[:len(small.test)], small.test.inputs)
    assert torch.equal(grown.train.inputs[:len(small.train)], small.train.inputs)
    root = image_folder(tmp_path / "imgs", per_class=6)
    before = load_data(str(root), "tiny-cnn").test.inputs
    (root / "circle" / "00a.png").write_bytes(png_bytes(class_image(0, 77)))  # sorts between existing files
    (root / "aardvark").mkdir()  # a new class sorts first: every label shifts, no image changes side
    (root / "aardvark" / "z.png").write_bytes(png_bytes(class_image(2, 78)))
    names, files = datasets.image_files(str(root))
    after = load_data(str(root), "tiny-cnn")
    after_test = [f for f, _ in files if datasets.in_test_split(os.path.relpath(f, root))]
    old = [i for i, f in enumerate(after_test) if os.path.basename(f) not in ("00a.png", "z.png")]
    assert len(before) > 0 and torch.equal(after.test.inputs[old], before)


def test_csv_label_column_and_pt_file(tmp_path):
    x, y = features(n=20)
    write_csv(tmp_path / "d.csv", x, y, label_at=5)
    data = load_data(f"{tmp_path / 'd.csv'}#label=label", "tiny-mlp")
    everything = torch.cat([data.train.inputs, data.test.inputs])
    assert sorted(map(tuple, everything.tolist())) == sorted(map(tuple, torch.from_numpy(x).tolist()))
    torch.save((torch.from_numpy(x), torch.from_numpy(y)), tmp_path / "d.pt")
    from_pt = load_data(str(tmp_path / "d.pt"), "tiny-mlp")
    assert torch.equal(from_pt.train.inputs, data.train.inputs)  # same split for the same samples


def test_decoded_folders_are_cached_until_a_file_changes(tmp_path, cache_dir, monkeypatch):
    root = image_folder(tmp_path / "imgs", per_class=4)
    first = load_data(str(root), "tiny-cnn").train.inputs
    assert len(list((cache_dir / "datasets").glob("*.pt"))) == 1

    def no_decoding(file, shape):
        raise AssertionError(f"decoded {file} again")

    monkeypatch.setattr(datasets, "_decode", no_decoding)
    assert torch.equal(load_data(str(root), "tiny-cnn").train.inputs, first)  # from the cache
    (root / "cross" / "00.png").write_bytes(png_bytes(class_image(0, 99)))  # same name, other bytes
    with pytest.raises(AssertionError, match="decoded"):
        load_data(str(root), "tiny-cnn")
    monkeypatch.undo()
    monkeypatch.setenv("HPPCTL_CACHE_DIR", str(cache_dir))
    changed = load_data(str(root), "tiny-cnn").train.inputs
    assert not torch.equal(changed, first) and len(list((cache_dir / "datasets").glob("*.pt"))) == 2


def test_parsed_csv_files_are_cached_until_they_change(tmp_path, cache_dir, monkeypatch):
    x, y = features(n=20)
    path = write_csv(tmp_path / "d.csv", x, y)
    first = load_data(str(path), "tiny-mlp").train.inputs

    def no_parsing(*args):
        raise AssertionError("parsed again")

    monkeypatch.setattr(datasets, "_csv_rows", no_parsing)
    assert torch.equal(load_data(str(path), "tiny-mlp").train.inputs, first)
    path.write_text(path.read_text().replace("label\n", "label\n\n", 1))  # a blank line: other bytes
    with pytest.raises(AssertionError, match="parsed again"):
        load_data(str(path), "tiny-mlp")


def test_a_damaged_cache_entry_is_decoded_again(tmp_path, cache_dir):
    root = image_folder(tmp_path / "imgs", per_class=4)
    first = load_data(str(root), "tiny-cnn").train.inputs
    (entry,) = (cache_dir / "datasets").glob("*.pt")
    entry.write_bytes(b"not a torch file")
    assert torch.equal(load_data(str(root), "tiny-cnn").train.inputs, first)
    assert torch.load(entry, weights_only=True)["pixels"].dtype == torch.uint8  # rewritten


# --- malformed datasets: exit 2, one line, no worker ---------------------------------------------

@pytest.fixture
def refused(cli, tmp_path, monkeypatch):
    """Run `hppctl run` on tiny-mlp or tiny-cnn with `--dataset` and extra flags; return the error line
    after checking exit 2, a single line, and that no worker was started."""
    started = []

    def record(*args, **kwargs):
        started.append(args)
        raise typer.Exit(0)  # as the fuzz gates stop a command where workers would start

    monkeypatch.setattr(launcher, "prepare_local_workers", record)

    def run(dataset, *flags, model="tiny-mlp", expect=2):
        layers = {"tiny-mlp": 5, "tiny-cnn": 11, "tiny-bert": 31}[model]
        save(tmp_path / "plan.yaml", make_plan(model, [((0, layers), ["a"], [4])], global_batch=8, micro_batch=4))
        save(tmp_path / "cluster.yaml", local_cluster("a"))
        code, out, err = cli("run", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "cluster.yaml",
                             "--dataset", dataset, *flags)
        if expect != 2:
            return code, started
        assert code == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        assert out == "" and not started
        return lines[0]
    return run


def test_a_good_dataset_reaches_the_workers(refused, tmp_path):
    x, y = features(n=20)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    code, started = refused(str(tmp_path / "d.npz"), expect=None)
    assert code == 0 and len(started) == 1  # the recorder stopped the launch: the refusals above are real


def _folder(tmp_path, per_class=2):
    return image_folder(tmp_path / "imgs", per_class=per_class)


def test_empty_folder(refused, tmp_path):
    (tmp_path / "imgs").mkdir()
    line = refused(str(tmp_path / "imgs"), model="tiny-cnn")
    assert f"--dataset {tmp_path / 'imgs'}: holds no class sub-folders" in line


def test_empty_class_folder(refused, tmp_path):
    root = _folder(tmp_path)
    (root / "zebra").mkdir()
    (root / "zebra" / "notes.txt").write_text("no image here")
    line = refused(str(root), model="tiny-cnn")
    assert f"--dataset {root / 'zebra'}: class folder holds no PNG or JPEG image" in line


@pytest.mark.parametrize("content, problem", [
    (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "cannot decode the image"),     # a PNG signature, then garbage
    ("truncated", "cannot decode the image"),                             # the first half of a real PNG
    (b"GIF89a" + b"\x00" * 40, "cannot decode the image"),                 # not PNG or JPEG
])
def test_corrupt_image(refused, tmp_path, content, problem):
    root = _folder(tmp_path)
    if content == "truncated":
        whole = png_bytes(class_image(1, 7, size=(64, 64)))
        content = whole[:len(whole) // 2]
    (root / "cross" / "05.png").write_bytes(content)
    line = refused(str(root), model="tiny-cnn")
    assert f"--dataset {root / 'cross' / '05.png'}: {problem}" in line


def test_sixteen_bit_image(refused, tmp_path):
    from PIL import Image

    root = _folder(tmp_path)
    Image.fromarray((np.arange(64, dtype=np.uint16) * 900).reshape(8, 8)).save(root / "circle" / "deep.png")
    line = refused(str(root), model="tiny-cnn")
    assert f"{root / 'circle' / 'deep.png'}: a I;16 image (16-bit or float pixels)" in line


def test_images_for_a_feature_model(refused, tmp_path):
    root = _folder(tmp_path)
    line = refused(str(root), model="tiny-mlp")
    assert "a folder of images needs a model that takes images (C×H×W); this one takes (32,)" in line


def test_more_class_folders_than_classes(refused, tmp_path):
    root = tmp_path / "imgs"
    for c in range(11):
        (root / f"c{c:02d}").mkdir(parents=True)
        (root / f"c{c:02d}" / "0.png").write_bytes(png_bytes(class_image(0, c)))
    line = refused(str(root), model="tiny-cnn")
    assert "11 class folders" in line and "more than the model's 10 classes" in line


class Hostile:
    """Unpickling this runs `touch` on a marker file: a dataset file must never get that far."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_pt_that_needs_pickle_runs_no_code(refused, tmp_path):
    marker = tmp_path / "pwned"
    with open(tmp_path / "d.pt", "wb") as f:
        torch.save((torch.zeros(20, 32), Hostile(marker)), f)
    line = refused(str(tmp_path / "d.pt"))
    assert f"--dataset {tmp_path / 'd.pt'}: needs pickle to load, refused" in line
    assert not marker.exists()


def test_plain_pickle_is_not_a_torch_file(refused, tmp_path):
    marker = tmp_path / "pwned"
    (tmp_path / "d.pt").write_bytes(pickle.dumps(Hostile(marker)))
    line = refused(str(tmp_path / "d.pt"))
    assert f"--dataset {tmp_path / 'd.pt'}:" in line and not marker.exists()


@pytest.mark.parametrize("content, problem", [
    ({"inputs": torch.zeros(20, 32), "labels": torch.zeros(20)}, "holds a dict, not an (inputs, labels) pair"),
    (torch.zeros(20, 32), "holds a Tensor, not an (inputs, labels) pair"),
    ((torch.zeros(20, 32), torch.zeros(20), torch.zeros(20)), "holds a tuple of 3 item(s), not an (inputs, labels)"),
    ((torch.zeros(20, 31), torch.zeros(20, dtype=torch.long)), "samples have shape (31,), the model takes (32,)"),
    ((torch.zeros(20, 32), torch.full((20,), 10)), "label of sample 0 is 10, outside the model's 10 classes (0 to 9)"),
    ((torch.zeros(20, 32), torch.tensor([0.0] * 7 + [2.5] + [0.0] * 12)), "label of sample 7 is 2.5, not an integer"),
    ((torch.zeros(20, 32), torch.full((20,), -1)), "label of sample 0 is -1, outside the model's 10 classes"),
    ((torch.zeros(20, 32), torch.zeros(19, dtype=torch.long)), "20 samples but 19 labels"),
    ((torch.zeros(20, 32), torch.zeros(20, 1, dtype=torch.long)), "labels have shape (20, 1)"),
    ((torch.zeros(0, 32), torch.zeros(0, dtype=torch.long)), "holds no samples"),
])
def test_malformed_pt(refused, tmp_path, content, problem):
    torch.save(content, tmp_path / "d.pt")
    line = refused(str(tmp_path / "d.pt"))
    assert f"--dataset {tmp_path / 'd.pt'}: {problem}" in line


@pytest.mark.parametrize("ids, problem", [
    (torch.full((20, 16), 1000), "sample 0 holds a token id outside 0..999 (the model's vocabulary)"),
    (torch.full((20, 16), -1), "sample 0 holds a token id outside 0..999"),
    (torch.full((20, 16), 1.5), "sample 0: the model takes token ids and this sample holds a value that is not an "
                                "integer"),
])
def test_token_ids_for_a_token_model(refused, tmp_path, ids, problem):
    torch.save((ids, torch.zeros(20, dtype=torch.long)), tmp_path / "d.pt")
    assert f"--dataset {tmp_path / 'd.pt'}: {problem}" in refused(str(tmp_path / "d.pt"), model="tiny-bert")


def test_token_ids_load_as_int64(tmp_path):
    torch.save((torch.randint(0, 1000, (20, 16)).float(), torch.arange(20) % 2), tmp_path / "d.pt")
    assert load_data(str(tmp_path / "d.pt"), "tiny-bert").train.inputs.dtype == torch.long


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_inputs(refused, tmp_path, value):
    x = torch.zeros(20, 32)
    x[13, 4] = value
    torch.save((x, torch.zeros(20, dtype=torch.long)), tmp_path / "d.pt")
    assert f"{tmp_path / 'd.pt'}: sample 13 holds NaN or infinity" in refused(str(tmp_path / "d.pt"))


def test_corrupt_pt(refused, tmp_path):
    torch.save((torch.zeros(20, 32), torch.zeros(20)), tmp_path / "d.pt")
    whole = (tmp_path / "d.pt").read_bytes()
    (tmp_path / "d.pt").write_bytes(whole[:len(whole) // 2])
    assert f"--dataset {tmp_path / 'd.pt'}: cannot read it as a torch file" in refused(str(tmp_path / "d.pt"))


@pytest.mark.parametrize("arrays, problem", [
    ({"x": np.zeros((20, 32))}, "has no array 'y' (holds x); an .npz dataset holds x (inputs) and y (labels)"),
    ({"inputs": np.zeros((20, 32)), "y": np.zeros(20)}, "has no array 'x' (holds inputs, y)"),
    ({"x": np.zeros((20, 32)), "y": np.array([object()] * 20)}, "array 'y' needs pickle to load, refused"),
    ({"x": np.array(["a"] * 20), "y": np.zeros(20)}, "array 'x' holds <U1 values, not numbers"),
    ({"x": np.zeros((20, 4, 8)), "y": np.zeros(20)}, "samples have shape (4, 8), the model takes (32,)"),
    ({"x": np.zeros((20, 32)), "y": np.arange(20)}, "label of sample 10 is 10, outside the model's 10 classes"),
])
def test_malformed_npz(refused, tmp_path, arrays, problem):
    np.savez(tmp_path / "d.npz", **arrays)
    assert f"--dataset {tmp_path / 'd.npz'}: {problem}" in refused(str(tmp_path / "d.npz"))


def test_corrupt_npz(refused, tmp_path):
    (tmp_path / "d.npz").write_bytes(b"PK\x03\x04 not really a zip")
    assert f"--dataset {tmp_path / 'd.npz'}: cannot read it as an .npz archive" in refused(str(tmp_path / "d.npz"))


def _csv(tmp_path, edit=None, label_at=None):
    x, y = features(n=20)
    path = write_csv(tmp_path / "d.csv", x, y, label_at=label_at)
    if edit is not None:
        lines = path.read_text().splitlines()
        edit(lines)
        path.write_text("\n".join(lines) + "\n")
    return path


def _set_cell(line: int, column: int, value: str):
    def edit(lines):
        cells = lines[line - 1].split(",")
        cells[column] = value
        lines[line - 1] = ",".join(cells)
    return edit


@pytest.mark.parametrize("edit, problem", [
    (_set_cell(5, 3, "abc"), "line 5, column 'f3': 'abc' is not a number"),
    (_set_cell(6, 0, ""), "line 6, column 'f0': '' is not a number"),
    (_set_cell(7, 2, "nan"), "line 7, column 'f2': nan is not a finite number"),
    (_set_cell(8, 31, "-inf"), "line 8, column 'f31': -inf is not a finite number"),
    (_set_cell(9, 32, "3.5"), "line 9, column 'label': the label 3.5 is not an integer class index"),
    (_set_cell(10, 32, "10"), "line 10, column 'label': the label 10 is outside the model's 10 classes (0 to 9)"),
    (lambda lines: lines.__setitem__(4, lines[4] + ",7"), "line 5: 34 cells, the header has 33"),
    (lambda lines: lines.__setitem__(11, lines[11].rsplit(",", 2)[0]), "line 12: 31 cells, the header has 33"),
    (lambda lines: lines.pop(0), "line 1 holds numbers; a CSV dataset starts with a header row"),
    (lambda lines: lines.__setitem__(slice(1, None), []), "has a header and no rows"),
    (lambda lines: lines.clear(), "is empty (a CSV dataset starts with a header row"),
])
def test_malformed_csv(refused, tmp_path, edit, problem):
    path = _csv(tmp_path, edit)
    assert f"--dataset {path}: {problem}" in refused(str(path))


def test_csv_with_too_few_features(refused, tmp_path):
    path = _csv(tmp_path, lambda lines: lines.__setitem__(slice(None), [",".join(s.split(",")[2:]) for s in lines]))
    line = refused(str(path))
    assert f"--dataset {path}: 30 feature columns (besides the label column 'label'); the model takes (32,)" in line


def test_csv_that_is_not_text(refused, tmp_path):
    (tmp_path / "d.csv").write_bytes(b"a,b\n\xff\xfe,1\n")
    assert f"--dataset {tmp_path / 'd.csv'}: is not UTF-8 text" in refused(str(tmp_path / "d.csv"))


def test_label_column_must_exist(refused, tmp_path):
    path = _csv(tmp_path)
    line = refused(str(path), "--label-column", "species")
    assert f"--label-column: 'species' is not a column of {path} (columns: f0, f1," in line


def test_label_column_is_for_csv_only(refused, tmp_path):
    x, y = features(n=20)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    line = refused(str(tmp_path / "d.npz"), "--label-column", "y")
    assert f"--label-column: only for a CSV dataset (--dataset {tmp_path / 'd.npz'})" in line


@pytest.mark.parametrize("name, problem", [
    ("missing.npz", "no such file or folder"),
    ("nowhere/imgs", "no such file or folder"),
    ("d.txt", "not a dataset (a folder of class sub-folders of images, or a .pt, .npz or .csv file)"),
])
def test_paths_that_are_not_datasets(refused, tmp_path, name, problem):
    (tmp_path / "d.txt").write_text("1,2,3\n")
    assert f"--dataset {tmp_path / name}: {problem}" in refused(str(tmp_path / name))


def test_every_class_folder_listed_once(tmp_path):
    root = _folder(tmp_path, per_class=3)
    (root / "stripes" / "more").mkdir()
    (root / "stripes" / "more" / "x.PNG").write_bytes(png_bytes(class_image(2, 50)))
    names, files = datasets.image_files(str(root))
    assert names == list(CLASSES)
    assert [os.path.relpath(f, root) for f, _ in files][-4:] == [
        "stripes/00.png", "stripes/01.png", "stripes/02.png", "stripes/more/x.PNG"]


# --- the same refusals from a real process: no warning or traceback adds a line -------------------

def _plain_pickle(tmp_path):
    (tmp_path / "d.pt").write_bytes(pickle.dumps(Hostile(tmp_path / "pwned")))
    return tmp_path / "d.pt", "tiny-mlp"


def _truncated_png(tmp_path):
    root = _folder(tmp_path)
    whole = png_bytes(class_image(1, 7, size=(64, 64)))
    (root / "cross" / "05.png").write_bytes(whole[:len(whole) // 2])
    return root, "tiny-cnn"


@pytest.mark.parametrize("make", [_plain_pickle, _truncated_png])  # where torch and Pillow could warn
def test_one_line_from_a_real_process(tmp_path, make):
    import subprocess
    import sys

    dataset, model = make(tmp_path)
    layers = {"tiny-mlp": 5, "tiny-cnn": 11}[model]
    save(tmp_path / "plan.yaml", make_plan(model, [((0, layers), ["a"], [4])], global_batch=8, micro_batch=4))
    save(tmp_path / "cluster.yaml", local_cluster("a"))
    env = {**os.environ, "HPPCTL_CACHE_DIR": str(tmp_path / "cache"), "PYTHONWARNINGS": "default"}
    done = subprocess.run([sys.executable, "-m", "hppctl", "run", "--plan", str(tmp_path / "plan.yaml"),
                           "--cluster", str(tmp_path / "cluster.yaml"), "--dataset", str(dataset)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith(f"error: --dataset {dataset}")
    assert done.stdout == "" and not (tmp_path / "pwned").exists()
