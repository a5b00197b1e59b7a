"""cache.py: per-batch-size files, completeness, skips that depend on the budget, torn files."""

from hppctl.profiling.cache import MeasurementCache, cache_key


def cache(tmp_path, **parts) -> MeasurementCache:
    return MeasurementCache(tmp_path, {"model": "m", "device": "dev-1", **parts})


def test_key_depends_on_every_part(tmp_path):
    assert cache_key({"a": 1, "b": 2}) == cache_key({"b": 2, "a": 1})
    assert cache(tmp_path).dir != cache(tmp_path, device="dev-2").dir
    assert cache(tmp_path).dir == cache(tmp_path).dir


def test_a_batch_is_complete_with_its_memory_and_enough_passes(tmp_path):
    c = cache(tmp_path)
    assert not c.complete(4, repeats=2) and c.passes(4) == [] and c.setup() is None
    c.store_memory({"type": "memory", "batch_size": 4, "peak_bytes": 1})
    c.add_pass({"type": "pass", "batch_size": 4, "n": 1})
    assert not c.complete(4, repeats=2)
    c.add_pass({"type": "pass", "batch_size": 4, "n": 2})
    assert c.complete(4, repeats=2) and [p["n"] for p in c.passes(4)] == [1, 2]
    assert (c.dir / "key.json").exists()
    again = cache(tmp_path)
    assert again.complete(4, repeats=2)
    again.clear()
    assert not again.complete(4, repeats=2)


def test_a_skip_holds_only_for_a_budget_no_larger(tmp_path):
    c = cache(tmp_path)
    c.store_skip(64, "too big", budget=10**9)
    assert c.skip(64, 10**9)["reason"] == "too big"
    assert c.skip(64, 5 * 10**8) is not None
    assert c.skip(64, 2 * 10**9) is None  # more memory now: try again


def test_a_torn_file_reads_as_missing(tmp_path):
    c = cache(tmp_path)
    c.store_memory({"type": "memory", "batch_size": 2})
    (c.dir / "memory-2.json").write_text('{"type": "mem')
    assert c.memory(2) is None


def test_a_pass_is_appended_not_the_whole_list_rewritten(tmp_path):
    """Each timed pass used to rewrite (and fsync) the whole list of the batch size's passes: quadratic
    in `--repeats` (400 repeats of tiny-cnn spent a third of their time there). A pass is one line now."""
    c = cache(tmp_path)
    c.add_pass({"type": "pass", "batch_size": 4, "n": 1})
    (path,) = c.dir.glob("passes-4.*")
    inode, before = path.stat().st_ino, path.read_bytes()
    c.add_pass({"type": "pass", "batch_size": 4, "n": 2})
    assert path.stat().st_ino == inode and path.read_bytes().startswith(before)
    assert [p["n"] for p in c.passes(4)] == [1, 2]


def test_a_pass_torn_by_a_crash_is_dropped_and_the_next_one_kept(tmp_path):
    c = cache(tmp_path)
    c.add_pass({"type": "pass", "batch_size": 4, "n": 1})
    (path,) = c.dir.glob("passes-4.*")
    with path.open("a") as f:
        f.write('{"type": "pass", "batch_size": 4, "n"')  # the crash came mid-line
    again = cache(tmp_path)
    assert [p["n"] for p in again.passes(4)] == [1] and not again.complete(4, repeats=2)
    again.store_memory({"type": "memory", "batch_size": 4})
    again.add_pass({"type": "pass", "batch_size": 4, "n": 3})
    assert [p["n"] for p in cache(tmp_path).passes(4)] == [1, 3] and again.complete(4, repeats=2)
    again.forget_passes(4)
    assert cache(tmp_path).passes(4) == [] and not again.complete(4, repeats=1)
