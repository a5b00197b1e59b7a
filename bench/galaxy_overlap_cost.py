"""Why Galaxy's tile overlap does not pay on the lab: gloo's CPU per byte and the overlap's own cost.

    python bench/galaxy_overlap_cost.py                       # lab up (root), 3 hosts, measure, lab down
    python bench/galaxy_overlap_cost.py --cpu 0.084 --hosts 3 --repeats 9

Brings up a lab of `--hosts` hosts at `--cpu` core each (CFS quota, as bench/galaxy_latency.py's
Nano-M) and 125 Mbit/s, with 1 MB socket buffers, and runs on every host, in its namespace and
cgroup, one process of the ring (gloo, one torch thread) that measures, with BERT-large's shapes at
sequence length 284 on a galaxy share of 1/D of the heads and columns, fp16 on the wire:

- `transfer`: ring steps that only move tiles (no GEMM): wall seconds and the process's CPU seconds
  (all threads: gloo's too) per byte sent + received;
- `gemm whole` / `gemm tiles`: the block's first GEMM on the whole sequence, and in D row tiles;
- per block (QKV AllGather, output ReduceScatter, MLP-in AllGather, MLP-out ReduceScatter): the
  fused collective of hppctl/runtime/galaxy/ring.py with and without the overlap;
- `allreduce` (gloo's own, megatron's) against the ring ReduceScatter + AllGather of the same tensor.

Each figure is the median of `--repeats` (after a barrier each); rank 0's line is printed. The
driver prints one JSON document per host with `--json`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timed(fn, repeats: int, barrier) -> dict:
    """Median wall and process CPU (every thread of the process: gloo's I/O threads included) of `fn`."""
    walls, cpus = [], []
    fn()  # warm-up
    for _ in range(repeats):
        barrier()
        c, t = time.process_time(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "min_wall_s": min(walls)}


def worker(a) -> None:
    import torch
    import torch.distributed as dist

    from hppctl.runtime.bootstrap import interface_for, route_source
    from hppctl.runtime.galaxy.ring import Ring

    torch.set_num_threads(1)
    if a.rank != 0:
        os.environ["GLOO_SOCKET_IFNAME"] = interface_for(route_source(a.master)) or ""
    else:
        os.environ["GLOO_SOCKET_IFNAME"] = interface_for(a.master) or ""
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}:29611", rank=a.rank, world_size=a.world)
    D, s, h, heads, inter = a.world, a.seq_len, 1024, 16, 4096
    rows = [s // D + (1 if i < s % D else 0) for i in range(D)]
    ring = Ring(a.rank, rows, wire_dtype=torch.float16)
    g = torch.Generator().manual_seed(a.rank)
    mine = torch.randn(rows[a.rank], h, generator=g)
    a_cols, b_cols = 3 * (heads // D) * 64, inter // D
    w_qkv, w_o = torch.randn(a_cols, h, generator=g) * 0.02, torch.randn(h, a_cols // 3, generator=g) * 0.02
    w1, w2 = torch.randn(b_cols, h, generator=g) * 0.02, torch.randn(h, b_cols, generator=g) * 0.02
    heads_out, hidden = torch.randn(s, a_cols // 3, generator=g), torch.randn(s, b_cols, generator=g)
    whole = torch.randn(s, h, generator=g)
    barrier = dist.barrier
    out: dict = {"rank": a.rank, "world": D, "rows": rows, "cpu_quota": a.cpu}

    def transfer():
        ring.allgather(mine)  # D-1 steps of one tile each way, no GEMM

    tile_bytes = rows[0] * h * 2
    t = timed(transfer, a.repeats, barrier)
    moved = 2 * (D - 1) * tile_bytes  # sent + received per device
    out["transfer"] = {**t, "bytes_sent_and_received": moved, "cpu_s_per_byte": t["cpu_s"] / moved,
                       "link_s": (D - 1) * tile_bytes * 8 / a.bandwidth_bps}
    with torch.inference_mode():
        out["gemm whole"] = timed(lambda: torch.nn.functional.linear(whole, w_qkv), a.repeats, barrier)
        out["gemm tiles"] = timed(lambda: [torch.nn.functional.linear(whole[ring.rows(j)], w_qkv) for j in range(D)],
                                  a.repeats, barrier)
        blocks = {
            "qkv allgather": lambda ov: ring.allgather_gemm(mine, lambda t: torch.nn.functional.linear(t, w_qkv), overlap=ov),
            "out reducescatter": lambda ov: ring.gemm_reducescatter(
                lambda r: torch.nn.functional.linear(heads_out[r], w_o), overlap=ov),
            "mlp-in allgather": lambda ov: ring.allgather_gemm(
                mine, lambda t: torch.nn.functional.gelu(torch.nn.functional.linear(t, w1)), overlap=ov),
            "mlp-out reducescatter": lambda ov: ring.gemm_reducescatter(
                lambda r: torch.nn.functional.linear(hidden[r], w2), overlap=ov),
        }
        for name, fn in blocks.items():
            for ov in (False, True):
                out[f"{name} {'overlap' if ov else 'plain'}"] = timed(lambda: fn(ov), a.repeats, barrier)
        partial = torch.randn(s, h, generator=g)

        def ring_allreduce():
            mine_sum = ring.gemm_reducescatter(lambda r: partial[r], overlap=False)
            ring.allgather(mine_sum)

        out["allreduce gloo"] = timed(lambda: ring.allreduce(partial.clone()), a.repeats, barrier)
        out["allreduce ring rs+ag"] = timed(ring_allreduce, a.repeats, barrier)
    print(json.dumps(out))
    dist.destroy_process_group()


def lab_spec(name: str, subnet: str, hosts: int, cpu: float) -> str:
    lines = "\n".join(f"  - {{name: h{i}, cpu: {cpu}, memory: 2GB}}" for i in range(hosts))
    return f"name: {name}\nbandwidth: 125mbit\nsubnet: {subnet}\nhosts:\n{lines}\n"


def driver(a) -> int:
    work = Path(tempfile.mkdtemp(prefix="galaxy-overlap-cost-"))
    (work / "lab.yaml").write_text(lab_spec(a.name, a.subnet, a.hosts, a.cpu))
    state = work / "state"
    hppctl = [sys.executable, "-m", "hppctl"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([*hppctl, "lab", "up", "--spec", str(work / "lab.yaml"), "--out", str(work / "cluster.yaml"),
                    "--state-dir", str(state)], check=True, env=env, cwd=ROOT)
    try:
        names = [f"h{i}" for i in range(a.hosts)]
        for host in names:
            subprocess.run(["ip", "netns", "exec", f"hppctl-lab-{a.name}-{host}", "sysctl", "-q", "-w",
                            "net.ipv4.tcp_rmem=4096 1048576 33554432", "net.ipv4.tcp_wmem=4096 1048576 4194304"],
                           check=True)
        import yaml
        cluster = yaml.safe_load((work / "cluster.yaml").read_text())
        master = next(d for d in cluster["devices"] if d["name"] == "h0")["host"]
        ssh_config = next(state.rglob("ssh_config"))
        procs = []
        for rank, host in enumerate(names):
            cmd = (f"cd {ROOT} && PYTHONPATH={ROOT} OMP_NUM_THREADS=1 {sys.executable} bench/galaxy_overlap_cost.py "
                   f"--worker --rank {rank} --world {a.hosts} --master {master} --repeats {a.repeats} --cpu {a.cpu}")
            procs.append(subprocess.Popen(["ssh", "-F", str(ssh_config), host, cmd], stdout=subprocess.PIPE, text=True))
        results = [json.loads(p.communicate(timeout=1800)[0].strip().splitlines()[-1]) for p in procs]
    finally:
        subprocess.run([*hppctl, "lab", "down", "--name", a.name, "--state-dir", str(state)], env=env, cwd=ROOT)
    if a.json:
        print(json.dumps(results, indent=2))
        return 0
    for r in results:
        print(f"rank {r['rank']} ({r['cpu_quota']} core), rows {r['rows']}")
        tr = r["transfer"]
        print(f"  transfer: {tr['wall_s']:.4f} s wall (link alone {tr['link_s']:.4f}), {tr['cpu_s']:.4f} s CPU, "
              f"{tr['cpu_s_per_byte'] * 1e9:.2f} ns CPU per byte sent+received")
        for k, v in r.items():
            if isinstance(v, dict) and "wall_s" in v and k != "transfer":
                print(f"  {k:28s} {v['wall_s']:.4f} s wall (min {v['min_wall_s']:.4f}), {v['cpu_s']:.4f} s CPU")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=3)
    p.add_argument("--master", default="127.0.0.1")
    p.add_argument("--name", default="gal28a")
    p.add_argument("--subnet", default="10.234.0.0/24")
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--cpu", type=float, default=0.084)
    p.add_argument("--seq-len", type=int, default=284)
    p.add_argument("--bandwidth-bps", type=float, default=125e6)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.worker:
        worker(a)
        return 0
    return driver(a)


if __name__ == "__main__":
    sys.exit(main())
