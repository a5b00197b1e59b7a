"""Two gloo ranks on loopback: rank 0 a helper whose `--order ltf` waiter posts a receive of client
c0's activations, rank 1 the client c0, which never sends (a silent device). Rank 0 prints what
`Arrivals.take` raised. Run by tests/psl/test_silent_peer.py: `python -m tests.psl.arrivals_probe RANK PORT`."""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

from hppctl.runtime.executor import ACTIVATIONS, tag
from hppctl.runtime.psl.roles import Arrivals


def main(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=2))
    if rank == 1:
        time.sleep(8)  # silent: sends nothing while the helper waits out its 2 s
        return
    tensor = torch.empty(4)
    arrivals = Arrivals({("F", "c0"): ([tensor], [dist.irecv(tensor, 1, tag=tag(0, ACTIVATIONS, 0))])}, timeout_s=30)
    try:
        arrivals.take(block=True)
        print("took an arrival")
    except Exception as e:  # noqa: BLE001 - the probe reports whatever came
        print(f"raised {e.__class__.__name__}: {str(e).splitlines()[0]}")
    sys.stdout.flush()
    os._exit(0)  # the peer is still asleep: no teardown handshake


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
