"""Issue 23, items 5, 7 (files) and 8: what hppctl reads and writes is refused in one line, exit 2.

Each case runs the CLI and asserts the contract for bad input: exit 2, exactly one stderr line
`error: FILE: …` naming the file, no traceback, and nothing left at the output path. The hang
cases (a FIFO) run `python -m hppctl` in a subprocess with a timeout, so that a regression fails
instead of blocking the test run.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from hppctl.store import save
from tests.conftest import make_profile

HANG_GUARD_S = 120  # not a speed assertion: only so that a blocking read fails the test instead of hanging it


def assert_one_line_refusal(code: int, stdout: str, stderr: str, named) -> None:
    lines = stderr.strip().splitlines()
    assert code == 2, stderr
    assert "Traceback" not in stderr and len(lines) == 1, stderr
    assert lines[0].startswith(f"error: {named}"), stderr


def hppctl(*argv) -> tuple[int, str, str]:
    """The real entry point in a child process (PYTHONPATH is inherited, so this tree wins)."""
    done = subprocess.run([sys.executable, "-m", "hppctl", *map(str, argv)], capture_output=True, text=True,
                          timeout=HANG_GUARD_S, stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "p.json"
    save(path, make_profile(layers=6, speeds=(1, 2), memory_gb=(4, 4)))
    return path


def plan_args(profile, *more):
    return ("plan", "--profile", profile, "--global-batch", 16, "--micro-batch", 4, *more)


# --- item 5: an output path is a regular file or missing, nothing else ---------------------------


def _special_files(tmp_path):
    """A symlink (to a file that must survive), a FIFO and, as root, a character device (/dev/null's
    numbers, created in tmp: the real /dev is never touched)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    made = {"symlink": tmp_path / "link.json", "fifo": tmp_path / "fifo.json"}
    made["symlink"].symlink_to(victim)
    os.mkfifo(made["fifo"])
    if os.geteuid() == 0:
        made["chardev"] = tmp_path / "null.json"
        os.mknod(made["chardev"], 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return victim, made


def _kinds():
    return ["symlink", "fifo"] + (["chardev"] if os.geteuid() == 0 else [])


@pytest.mark.parametrize("kind", _kinds())
def test_plan_out_never_replaces_a_symlink_fifo_or_device(cli, profile_file, tmp_path, kind):
    victim, made = _special_files(tmp_path)
    target = made[kind]
    before = os.lstat(target)
    code, out, err = cli(*plan_args(profile_file, "--out", target))
    assert_one_line_refusal(code, out, err, f"--out: {target}")
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)
    assert victim.read_text() == "keep me\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary left behind


@pytest.mark.parametrize("kind", _kinds())
def test_simulate_trace_never_replaces_a_symlink_fifo_or_device(cli, profile_file, tmp_path, kind):
    """The reported case: `simulate --trace /dev/null` as root replaced /dev/null with a regular file."""
    plan = tmp_path / "plan.json"
    assert cli(*plan_args(profile_file, "--out", plan))[0] == 0
    _, made = _special_files(tmp_path)
    target = made[kind]
    before = os.lstat(target)
    code, out, err = cli("simulate", "--plan", plan, "--trace", target)
    assert_one_line_refusal(code, out, err, f"--trace: {target}")
    assert os.lstat(target).st_ino == before.st_ino and os.lstat(target).st_mode == before.st_mode


def test_an_existing_regular_output_file_is_still_replaced(cli, profile_file, tmp_path):
    out = tmp_path / "plan.json"
    out.write_text("old\n")
    assert cli(*plan_args(profile_file, "--out", out))[0] == 0
    assert json.loads(out.read_text())["kind"] == "hpp"


def test_an_output_name_too_long_or_through_a_file_is_one_line(cli, profile_file, tmp_path):
    for target in (tmp_path / ("x" * 300 + ".json"), profile_file / "plan.json"):
        code, out, err = cli(*plan_args(profile_file, "--out", target))
        assert_one_line_refusal(code, out, err, f"--out: {target}")


# --- item 7 (files): OSError and RecursionError become one line -------------------------------------


def _deep_json(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    return path


def _deep_yaml(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 5000 + "]" * 5000)
    return path


def _through_a_file(tmp_path):
    (tmp_path / "f.yaml").write_text("a: 1\n")
    return tmp_path / "f.yaml" / "c.yaml"


def _long_name(tmp_path):
    return tmp_path / ("c" * 300 + ".yaml")


def _symlink_loop(tmp_path):
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(loop)
    return loop


def _a_directory(tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    return tmp_path / "dir.yaml"


def _not_utf8(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    return path


@pytest.mark.parametrize("make", [_deep_json, _deep_yaml, _through_a_file, _long_name, _symlink_loop, _a_directory,
                                  _not_utf8])
def test_unreadable_or_too_deep_input_is_one_line(cli, tmp_path, make):
    bad = make(tmp_path)
    for argv in (("plan", "--profile", bad, "--global-batch", 8, "--micro-batch", 1),
                 ("profile", "--cluster", bad, "--model", "tiny-cnn", "--out", tmp_path / "out.json")):
        code, out, err = cli(*argv)
        assert_one_line_refusal(code, out, err, bad)
        assert not (tmp_path / "out.json").exists()


def test_yaml_aliases_that_explode_are_refused(cli, tmp_path):
    """20 KB of YAML whose aliases expand to 4 x 10⁸ timings: refused before validation walks them
    (which took all memory: every device's `forward_s` is the same 1000 x 1000 matrix)."""
    row = "&r [" + ", ".join(["1.0"] * 1000) + "]"
    matrix = "&m [" + ", ".join([row] + ["*r"] * 999) + "]"
    devices = [f"  - {{name: d{k}, kind: x, memory_bytes: 1, batch_sizes: [1], forward_s: {matrix if k == 0 else '*m'}, "
               f"backward_s: *m}}" for k in range(200)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("source: preset\ncluster: c\nmodel: m\ngranularity: block\ndefault_bytes_per_s: 1\n"
                    "layers: [{name: l, kind: k, boundary_bytes_per_sample: 1, activation_bytes_per_sample: 1, "
                    "param_bytes: 1, forward_flops_per_sample: 1}]\ndevices:\n" + "\n".join(devices) + "\n")
    code, out, err = cli("plan", "--profile", bomb, "--global-batch", 8, "--micro-batch", 1)
    assert_one_line_refusal(code, out, err, bomb)
    assert "aliases" in err


# --- item 8: hangs and size ----------------------------------------------------------------------------


def test_a_fifo_as_cluster_is_refused_instead_of_blocking(tmp_path):
    fifo = tmp_path / "cluster.yaml"
    os.mkfifo(fifo)
    code, out, err = hppctl("profile", "--cluster", fifo, "--model", "tiny-cnn", "--out", tmp_path / "p.json")
    assert_one_line_refusal(code, out, err, fifo)
    assert "FIFO" in err and not (tmp_path / "p.json").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_a_character_device_as_profile_is_refused(cli, tmp_path):
    device = tmp_path / "zero.json"
    os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers: an endless read
    code, out, err = cli("plan", "--profile", device, "--global-batch", 8, "--micro-batch", 1)
    assert_one_line_refusal(code, out, err, device)


@pytest.mark.parametrize("suffix, size", [(".json", 16 * 2**20 + 1), (".yaml", 2 * 2**20 + 1)])
def test_a_file_over_the_size_limit_is_refused_before_it_is_read(cli, tmp_path, suffix, size):
    big = tmp_path / f"big{suffix}"
    with open(big, "wb") as f:  # sparse: the limit is checked on the size, not by reading
        f.truncate(size)
    code, out, err = cli("plan", "--profile", big, "--global-batch", 8, "--micro-batch", 1)
    assert_one_line_refusal(code, out, err, big)
    assert "limit" in err


def test_an_error_line_never_repeats_a_huge_value(cli, tmp_path):
    huge = "x" * (5 * 2**20)
    for doc in ({"name": huge, "devices": [{"name": "a", "preset": "jetson-nano"}]},
                {"name": "c", "devices": [{"name": "a", "preset": "jetson-nano", huge: 1}]},
                {"name": "c", "kind": huge, "devices": [{"name": "a", "preset": "jetson-nano"}]},
                {"name": "c", "devices": [{"name": "a", "preset": huge}]}):  # unknown preset, named by the profiler
        path = tmp_path / "c.json"
        path.write_text(json.dumps(doc))
        code, out, err = cli("profile", "--cluster", path, "--model", "tiny-cnn", "--json")
        assert_one_line_refusal(code, out, err, path)
        assert len(err) < 600 and "…" in err


PSL_SPEC = """\
name: tiny
model: mobilenetv2
cut: [3, 15]
clients:
  - {name: pi, preset: rpi4, count: 3}
helpers:
  - {name: lap, preset: laptop-cpu}
"""


@pytest.mark.parametrize("edit, needle", [
    (lambda s: s.replace("count: 3", "count: 1000000"), "clients.0.count: Input should be less than or equal to 5000 (got 1000000)"),
    (lambda s: s + "slot: 1e-12\n", "slot: slot must be at least 1e-06 s"),
])
def test_psl_specs_beyond_the_limits_are_refused_before_planning(cli, tmp_path, edit, needle):
    spec = tmp_path / "psl.yaml"
    spec.write_text(edit(PSL_SPEC))
    code, out, err = cli("psl", "plan", "--spec", spec, "--method", "admm", "--out", tmp_path / "plan.json")
    assert_one_line_refusal(code, out, err, spec)
    assert needle in err and not (tmp_path / "plan.json").exists()


def test_a_slot_grid_beyond_the_limit_is_refused(cli, tmp_path):
    """A slot of a microsecond passes the spec check but makes ~1.5 x 10⁵ slots of this instance's horizon."""
    spec = tmp_path / "psl.yaml"
    spec.write_text(PSL_SPEC.replace("count: 3", "count: 30") + "slot: 1us\n")
    code, out, err = cli("psl", "plan", "--spec", spec, "--method", "admm", "--out", tmp_path / "plan.json")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("error: slot: 1e-06 s makes a forward horizon of") and "more than the limit of 100000" in err
    assert not (tmp_path / "plan.json").exists()


def test_a_million_micro_batches_are_refused_and_ten_thousand_allowed(cli, profile_file, tmp_path):
    out = tmp_path / "plan.json"
    code, stdout, err = cli("plan", "--profile", profile_file, "--global-batch", 10**6, "--micro-batch", 1, "--out", out)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "1000000 micro-batches per round, more than the limit of 16384" in err and not out.exists()
    assert cli("plan", "--profile", profile_file, "--global-batch", 10_000, "--micro-batch", 1, "--json")[0] == 0


def test_a_cluster_over_the_device_limit_is_refused_naming_the_field(cli, tmp_path):
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"name": "c", "devices": [{"name": f"d{k}", "preset": "jetson-nano"}
                                                            for k in range(20_001)]}))
    code, out, err = cli("profile", "--cluster", cluster, "--model", "tiny-cnn", "--json")
    assert_one_line_refusal(code, out, err, f"{cluster}: devices: List should have at most 20000 items")


def test_an_hf_config_nested_too_deep_is_one_line(cli, tmp_path):
    """`hf:DIR` reads DIR/config.json: 10⁵ nested lists were a RecursionError traceback."""
    (tmp_path / "ckpt").mkdir()
    config = tmp_path / "ckpt" / "config.json"
    config.write_text("[" * 100_000 + "]" * 100_000)
    code, out, err = cli("models", f"hf:{tmp_path / 'ckpt'}")
    assert_one_line_refusal(code, out, err, config)
