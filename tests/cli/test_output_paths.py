"""Issue 23 item 5, the remaining holes: every output flag of every command is checked before the work
starts, streamed outputs (`--log`, `--metrics`, `--events`) never follow a symlink or block on a
FIFO, `--input-ids` is read within the file limits, and no error line repeats a huge argument.

The ordering is shown without timing anything: each command is given inputs that do not exist, so a
command that checks its outputs first names the output flag, and one that reads its inputs first
names the missing input (as every one of them did before).
"""

from __future__ import annotations

import json
import os
import stat

import pytest

from hppctl.errors import BadInput
from tests.cli.test_file_rules import hppctl

MISSING = "missing"  # placeholder for an input file that does not exist

# (command line with missing inputs, output flag): every command's output flags (demo's are its --out-dir files)
COMMANDS = [
    (("plan", "--profile", MISSING, "--global-batch", 8, "--micro-batch", 2), "--out"),
    (("simulate", "--plan", MISSING), "--trace"),
    (("simulate", "--plan", MISSING), "--png"),
    (("simulate", "--plan", MISSING), "--write-schedule"),
    (("profile", "--cluster", MISSING, "--model", "tiny-cnn"), "--out"),
    (("profile", "--cluster", MISSING, "--model", "bert-tiny", "--seq-len", 8), "--out"),
    (("run", "--plan", MISSING, "--cluster", MISSING), "--save-model"),
    (("run", "--plan", MISSING, "--cluster", MISSING), "--metrics"),
    (("run", "--plan", MISSING, "--cluster", MISSING), "--log"),
    (("run", "--plan", MISSING, "--cluster", MISSING), "--trace"),
    (("run", "--plan", MISSING, "--cluster", MISSING), "--output"),
    (("psl", "plan", "--spec", MISSING), "--out"),
    (("psl", "simulate", "--plan", MISSING), "--trace"),
    (("psl", "run", "--plan", MISSING, "--cluster", MISSING), "--metrics"),
    (("psl", "run", "--plan", MISSING, "--cluster", MISSING), "--save-model"),
    (("psl", "run", "--plan", MISSING, "--cluster", MISSING), "--log"),
    (("coordinator", "--plan", MISSING, "--cluster", MISSING, "--profile", MISSING), "--events"),
    (("lab", "up", "--spec", MISSING), "--out"),
]
SUFFIX = {"--png": ".png", "--save-model": ".pt", "--output": ".pt", "--metrics": ".jsonl", "--events": ".jsonl",
          "--log": ".log"}


def _kinds():
    return ["symlink", "fifo"] + (["chardev"] if os.geteuid() == 0 else [])


def _make(kind: str, path, victim) -> None:
    """A symlink to `victim` (a file that must survive), a FIFO or, as root, a character device with
    /dev/null's numbers, made in tmp: the real /dev is never touched."""
    if kind == "symlink":
        path.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


def _assert_refused_naming(code: int, err: str, flag: str, target) -> None:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(f"error: {flag}: {target}: is "), err  # the output, not the missing input


def _case_id(argv, flag) -> str:
    words = [str(a) for a in argv[:2] if not str(a).startswith("--")]
    return " ".join(words + (["--seq-len"] if "--seq-len" in argv else []) + [flag])


@pytest.mark.parametrize("kind", _kinds())
@pytest.mark.parametrize("argv, flag", COMMANDS, ids=[_case_id(a, f) for a, f in COMMANDS])
def test_every_output_flag_is_checked_before_any_input_is_read(cli, tmp_path, argv, flag, kind):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    target = tmp_path / f"out{SUFFIX.get(flag, '.json')}"
    _make(kind, target, victim)
    before = os.lstat(target)
    argv = [tmp_path / f"{MISSING}.json" if a == MISSING else a for a in argv]
    code, _, err = cli(*argv, flag, target)
    _assert_refused_naming(code, err, flag, target)
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)
    assert victim.read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([victim.name, target.name])  # nothing created


@pytest.mark.parametrize("name", ["metrics.jsonl", "model.pt"])
def test_demo_refuses_a_symlink_in_its_workdir_before_profiling(cli, tmp_path, name):
    """The demo's metrics went through `open(path, "w")`: a symlink there emptied its target after training."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / name).symlink_to(victim)
    code, _, err = cli("demo", "--out-dir", work, "--epochs", 1)
    _assert_refused_naming(code, err, "--out-dir", work / name)
    assert victim.read_text() == "keep me\n" and sorted(p.name for p in work.iterdir()) == [name]


def test_a_huge_argument_is_not_repeated_in_the_error_line(tmp_path):
    """Paths and flag values are user text too: a 100,000-character --profile was a 100 KB error line."""
    for argv in (("plan", "--profile", tmp_path / ("p" * 100_000 + ".json"), "--global-batch", 8, "--micro-batch", 2),
                 ("psl", "run", "--plan", tmp_path / "p.json", "--cluster", tmp_path / "c.json", "--optimizer", "x" * 100_000),
                 ("plan", "--profile", tmp_path / "a\nb\nc.json", "--global-batch", 8, "--micro-batch", 2)):
        code, _, err = hppctl(*argv)
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err[:300]
        assert len(err) < 1200, err[:300]


@pytest.mark.parametrize("memory", ["9" * 400, "9" * 400 + ".0", "'" + "9" * 400 + " GB'"])
def test_a_400_digit_memory_is_one_short_line(cli, tmp_path, memory):
    cluster = tmp_path / "c.yaml"
    cluster.write_text(f"name: c\ndevices:\n  - {{name: a, preset: jetson-nano, memory: {memory}}}\n")
    code, _, err = cli("profile", "--cluster", cluster, "--model", "tiny-cnn", "--json")
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith(f"error: {cluster}: devices.0.memory")
    assert len(err) < 400, err


@pytest.mark.parametrize("where", ["top", "device", "link"])
def test_a_one_megabyte_key_is_one_short_line(cli, tmp_path, where):
    key = "k" * 2**20
    doc = {"name": "c", "devices": [{"name": "a", "preset": "jetson-nano"}, {"name": "b", "preset": "rpi4"}]}
    {"top": doc, "device": doc["devices"][0]}.get(where, doc)[key] = 1
    if where == "link":
        doc.pop(key)
        doc["links"] = [{"between": ["a", "b"], "bandwidth": "1 Gbps", key: 1}]
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps(doc))
    code, _, err = cli("profile", "--cluster", cluster, "--model", "tiny-cnn", "--json")
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith(f"error: {cluster}: "), err[:300]
    assert len(err) < 400 and "…" in err, err[:300]


# --- --input-ids: read like every other input (regular file, size limit) -----------------------------


def _input_ids_cases(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:  # sparse: refused on its size, never read
        f.truncate(16 * 2**20 + 1)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    cases = {big: "more than the limit", fifo: "a FIFO", tmp_path / "none.json": "no such file"}
    if os.geteuid() == 0:
        null = tmp_path / "null.pt"
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        cases[null] = "a character device"
    return cases


def test_input_ids_are_read_within_the_file_rules(tmp_path):
    from hppctl.driver import read_input_ids

    for path, needle in _input_ids_cases(tmp_path).items():
        with pytest.raises(BadInput) as caught:
            read_input_ids(path)
        message = str(caught.value)
        assert message.startswith(f"--input-ids: {path}: ") and needle in message and "\n" not in message, message
    ok = tmp_path / "ids.json"
    ok.write_text(json.dumps({"input_ids": [[1, 2], [3, 4]]}))
    assert read_input_ids(ok).tolist() == [1, 2, 3, 4]


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_a_real_run_appends_to_its_log_and_empties_its_metrics_first(cli, tmp_path):
    """The streams as a run uses them (store.open_output_stream): --log keeps what was there,
    --metrics holds this run's rounds only."""
    from hppctl.store import save
    from tests.runtime.factories import local_cluster, make_plan
    from tests.runtime.test_run_cli import TWO_STAGES

    save(tmp_path / "plan.yaml", make_plan("tiny-mlp", TWO_STAGES, global_batch=16, micro_batch=4))
    save(tmp_path / "cluster.yaml", local_cluster("a", "b", "c"))
    log, metrics = tmp_path / "w.log", tmp_path / "m.jsonl"
    log.write_text("earlier run\n")
    metrics.write_text("stale\n" * 100)
    code, _, err = cli("run", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "cluster.yaml", "--rounds", 2,
                       "--dataset", "tests.runtime.userdata:features", "--log", log, "--metrics", metrics, "--json")
    assert code == 0, err
    assert log.read_text().startswith("earlier run\n")
    assert [json.loads(line)["round"] for line in metrics.read_text().splitlines()] == [0, 1]


@pytest.mark.parametrize("field", ["python", "host", "user"])
def test_a_megabyte_of_cluster_text_is_refused_in_one_short_line(cli, tmp_path, field):
    """A 1 MB `python:` was run, failed, and came back whole twice: 2 MB of stderr, exit 1."""
    device = {"name": "a", "local": True} if field == "python" else {"name": "a", "host": "h"}
    device[field] = "n" * 2**20
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"name": "c", "devices": [device]}))
    code, _, err = cli("profile", "--cluster", cluster, "--model", "tiny-cnn", "--json")
    assert code == 2 and len(err.strip().splitlines()) == 1, err[:300]
    assert err.startswith(f"error: {cluster}: devices.0.{field}: String should have at most 4096 characters"), err[:300]
    assert len(err) < 400


def test_a_runtime_failure_keeps_its_lines_each_bounded(monkeypatch, capsys):
    """A worker's failure (exit 1) keeps its last output lines, but none of them may be huge."""
    import hppctl.cli
    from hppctl.errors import RuntimeFailure

    def fail(**_):
        raise RuntimeFailure("worker on device a failed (exit 1)\n  last lines:\n    " + "x" * 100_000)

    monkeypatch.setattr(hppctl.cli, "app", fail)
    assert hppctl.cli.run(["run"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "error: worker on device a failed (exit 1)" and len(lines) == 3
    assert max(map(len, lines)) <= 1000
