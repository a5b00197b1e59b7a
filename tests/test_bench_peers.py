"""bench/peers.py's logic that needs no lab: arguments, step times to samples/s, ratios within a
cycle and their median, the first-loss check, and the peer worker's equal split."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.bench_modules import BENCH, load_bench


@pytest.fixture(scope="module")
def peers():
    return load_bench("peers")


def test_defaults_name_each_lab_its_own_name_and_subnet(peers):
    envb, homog = peers.parse_args([]), peers.parse_args(["--homogeneous"])
    assert (envb.lab_name, envb.subnet) == ("peerb28", "10.232.0.0/24")
    assert (homog.lab_name, homog.subnet) == ("peerh28", "10.233.0.0/24")
    assert envb.strategy_list == ["asteroid", "dp", "ddp", "pipe-1f1b", "pipe-gpipe"]
    assert (envb.micro_batch, envb.rounds, envb.warmup) == (32, 14, 2)
    assert peers.parse_args(["--micro-batch", "auto"]).micro_batch == "auto"


@pytest.mark.parametrize("argv", [["--micro-batch", "0"], ["--micro-batch", "x"], ["--strategies", "dp,dp"],
                                  ["--warmup", "14"], ["--repeat", "0"]])
def test_bad_arguments_exit_2(peers, argv, capsys):
    with pytest.raises(SystemExit) as e:
        peers.parse_args(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_a_peer_step_lasts_as_long_as_its_slowest_rank(peers):
    ranks = [{"step_s": [3.0, 1.0, 2.0, 1.0]}, {"step_s": [2.5, 2.0, 1.0, 1.0]}]
    steps = peers.peer_step_s(ranks)
    assert steps == [3.0, 2.0, 2.0, 1.0]
    # warm-up left out; 256 samples per step: 128, 128, 256 -> median 128
    assert peers.median_samples_per_s(steps, 256, 1) == 128.0
    with pytest.raises(ValueError):
        peers.peer_step_s([{"step_s": [1.0]}, {"step_s": [1.0, 1.0]}])


def test_ranks_past_the_timeout_are_killed_and_named_with_what_they_printed(peers, tmp_path):
    """A hung peer run says where each rank was (real processes: one printed and hangs, one hangs silent)."""
    code = ("import pathlib, sys, time; print(sys.argv[1], end='', flush=True); pathlib.Path(sys.argv[2]).touch(); "
            "time.sleep(600)")
    marks = [tmp_path / "a", tmp_path / "b"]  # each rank's "I have printed": the timeout starts after both
    procs = [subprocess.Popen([sys.executable, "-c", code, text, str(mark)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for text, mark in zip(("gloo-connecting", ""), marks)]
    while not all(m.exists() for m in marks) and all(p.poll() is None for p in procs):
        time.sleep(0.01)
    with pytest.raises(RuntimeError) as e:
        peers.peer_outputs("ddp", ["a", "b"], procs, 0.5)
    assert all(p.poll() is not None for p in procs)
    message = str(e.value)
    assert message.startswith("ddp did not finish within 0.5 s")
    assert "--- a (exit -9):\ngloo-connecting" in message and "--- b (exit -9):" in message


def test_a_finished_run_gives_every_ranks_whole_output(peers):
    procs = [subprocess.Popen([sys.executable, "-c", f"print({rank}); print('done')"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    assert peers.peer_outputs("ddp", ["a", "b"], procs, 60.0) == ["0\ndone\n", "1\ndone\n"]


def test_ratios_are_taken_within_a_cycle_then_their_median(peers):
    cycles = [{"asteroid": 300.0, "dp": 100.0, "ddp": 150.0, "pipe-1f1b": 200.0},
              {"asteroid": 150.0, "dp": 60.0, "ddp": 50.0, "pipe-1f1b": 100.0},  # a busy cycle: all slow
              {"asteroid": 330.0, "dp": 120.0, "ddp": 110.0, "pipe-1f1b": 300.0}]
    summary = peers.summarize(cycles)
    assert summary["ratios_per_cycle"][0]["asteroid/best_peer"] == 1.5
    assert summary["ratios_per_cycle"][2]["asteroid/best_peer"] == 1.1
    assert summary["ratios"]["asteroid/best_peer"] == 1.5  # median of 1.5, 1.5, 1.1
    assert summary["ratios"]["dp/ddp"] == pytest.approx(120 / 110)  # median of 0.667, 1.2, 1.09
    assert summary["samples_per_s"]["asteroid"] == 300.0
    assert summary["best_peer_per_cycle"] == ["pipe-1f1b", "pipe-1f1b", "pipe-1f1b"]
    # a ratio of medians would differ: 300 / 200 = 1.5 here, but the point is the cycle pairing
    text = peers.table(summary, cycles)
    assert "asteroid/best_peer" in text and "1.50x" in text


def test_no_asteroid_ratio_without_a_peer(peers):
    assert "asteroid/best_peer" not in peers.cycle_ratios({"asteroid": 1.0, "dp": 2.0})


def test_first_losses_are_checked_where_there_is_a_reference(peers):
    rows = peers.loss_checks({"ddp": 2.3001, "pipe-1f1b": 2.5, "asteroid": 2.4}, {"ddp": 2.3, "pipe-1f1b": 2.3})
    by = {r["strategy"]: r["ok"] for r in rows}
    assert by == {"ddp": True, "pipe-1f1b": False, "asteroid": None}


def test_ddp_shares_split_the_batch_evenly_and_cover_it():
    worker = load_bench("peer_worker")
    shares = [worker.equal_share(256, 3, r) for r in range(3)]
    assert shares == [(0, 86), (86, 171), (171, 256)]
    assert worker.parse_stages("0:20,20:142") == [(0, 20), (20, 142)]


def test_peer_layouts_are_ddp_shares_or_the_pp_plans_stages(peers):
    from types import SimpleNamespace

    layout, micro = peers.peer_layout("ddp", None, 142, 256, 3)
    assert (layout, micro) == ([(0, 142, [(0, 86), (1, 85), (2, 85)])], 256)
    pp = SimpleNamespace(micro_batch=32, stages=[SimpleNamespace(layers=[0, 40]), SimpleNamespace(layers=[40, 142])])
    layout, micro = peers.peer_layout("pipe-1f1b", pp, 142, 256, 5)
    assert (layout, micro) == ([(0, 40, [(0, 32)]), (40, 142, [(1, 32)])], 32)
    assert peers.dropout_seed(0, 0, 2) == 2 and peers.dropout_seed(1, 1, 0) == 1_000_003 + 1_009


@pytest.mark.gloo
@pytest.mark.parametrize("mode", ["ddp", "pipe-1f1b"])
def test_a_peer_rank_ends_before_python_finalizes(mode, tmp_path):
    """Two real ranks of bench/peer_worker.py over gloo on this machine print their results and exit 0
    without Python's finalization, during which a DDP rank's gloo threads (alive past
    destroy_process_group) could abort it after its result (SIGABRT, 2026-11-26 suite runs). An
    atexit handler, installed through sitecustomize, marks a finalization."""
    import socket

    (tmp_path / "sitecustomize.py").write_text(
        "import atexit, sys\natexit.register(lambda: print('FINALIZED', file=sys.stderr, flush=True))\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(BENCH.parent)]), "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, str(BENCH / "peer_worker.py"), "--mode", mode, "--model", "tiny-mlp",
            "--global-batch", "64", "--micro-batch", "64" if mode == "ddp" else "16", "--rounds", "2",
            *(["--stages", "0:2,2:5"] if mode != "ddp" else [])]
    ranks = [subprocess.Popen(argv, env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(2)]
    done = [p.communicate(timeout=300) for p in ranks]
    for p, (out, err) in zip(ranks, done):
        assert p.returncode == 0, err
        assert out.startswith(load_bench("peer_worker").RESULT_PREFIX), out
        assert "FINALIZED" not in err
    # the marker works: the same interpreter, finalizing, prints it
    check = subprocess.run([sys.executable, "-c", "pass"], env=env, capture_output=True, text=True, timeout=60)
    assert "FINALIZED" in check.stderr


def test_split_backward_runs_and_hppctls_fastest_are_set_against_the_best_peer(peers):
    ratios = peers.cycle_ratios({"asteroid": 300.0, "asteroid+zb": 330.0, "pp+zb": 360.0, "ddp": 150.0,
                                 "pipe-1f1b": 240.0})
    assert ratios["asteroid/best_peer"] == 1.25
    assert ratios["asteroid+zb/best_peer"] == 1.375
    assert ratios["best_hppctl/best_peer"] == 1.5


def test_a_zb_strategy_plans_the_split_form_of_its_base(tmp_path):
    from argparse import Namespace

    from tests.bench_modules import load_bench
    from tests.planner.test_split_backward_plan import with_weight_times
    from tests.conftest import make_profile

    hvb = load_bench("hpp_vs_baselines")
    profile = with_weight_times(make_profile(layers=8, speeds=(1.0, 2.0, 3.0)), 0.4)
    for micro_batch in ("8", "auto"):
        args = Namespace(micro_batch=micro_batch, global_batch=64)
        base, split = hvb.plan_for("pp", profile, args), hvb.plan_for("pp+zb", profile, args)
        assert not base.split_backward and split.split_backward
        assert [s.layers for s in split.stages] == [s.layers for s in base.stages] or micro_batch == "auto"


def test_a_peer_at_a_micro_batch_runs_pp_planned_there(peers):
    from argparse import Namespace

    from tests.conftest import make_profile

    assert peers.peer_mode("pipe-1f1b@16") == ("pipe-1f1b", "pp@16")
    assert peers.peer_mode("pipe-gpipe") == ("pipe-gpipe", "pp")
    assert peers.is_peer("pipe-1f1b@16") and peers.is_peer("ddp") and not peers.is_peer("asteroid+zb")
    profile = make_profile(layers=8, speeds=(1.0, 2.0, 3.0))
    plan = peers.pp_at("pp@8", profile, Namespace(micro_batch="auto", global_batch=64))
    assert plan.strategy == "pp" and plan.micro_batch == 8
    ratios = peers.cycle_ratios({"asteroid": 300.0, "pipe-1f1b@16": 250.0, "pipe-1f1b": 200.0})
    assert ratios["asteroid/best_peer"] == 1.2  # the best of the peer's micro-batches


def test_a_1f1b_peer_with_fewer_micro_batches_than_stages_is_dropped_before_any_run(peers, capsys):
    """torch's Schedule1F1B refuses n_microbatches < stages (ValueError in its constructor); the bench ran
    every strategy before it and then died, losing the figures. It now drops such a peer up front, saying
    why, and keeps the rest (GPipe has no such bound)."""
    from argparse import Namespace

    from hppctl.planner.manual import manual_plan

    five = [((a, b), [f"d{i}"], [64]) for i, (a, b) in enumerate([(0, 18), (18, 49), (49, 88), (88, 112), (112, 142)])]
    plans = {"pp@64": manual_plan("mobilenetv2", five, global_batch=256, micro_batch=64),
             "pp@16": manual_plan("mobilenetv2", [((a, b), d, [16]) for (a, b), d, _ in five],
                                  global_batch=256, micro_batch=16)}
    args = Namespace(strategy_list=["asteroid", "pipe-1f1b@16", "pipe-1f1b@64", "pipe-gpipe@64"])
    peers.drop_unrunnable_peers(args, plans)
    assert args.strategy_list == ["asteroid", "pipe-1f1b@16", "pipe-gpipe@64"]
    out = capsys.readouterr().out
    assert "pipe-1f1b@64: skipped" in out and "4 micro-batches" in out and "5 stages" in out
