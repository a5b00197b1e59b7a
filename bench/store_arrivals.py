"""What naming the replica absent from an AllReduce costs a round (docs/runtime.md, "Failures").

    python bench/store_arrivals.py [--rounds 2000]

Replicas of a stage of three or more tell the run's store each round that they reached its AllReduce
(`worker.StoreArrivals.reached`: one `set`, one `delete_key`). Timed here against a TCPStore on
loopback, the launcher's store as a local run has it; over a LAN add two round trips to the launcher.
"""

from __future__ import annotations

import argparse
import datetime
import time

from torch.distributed import TCPStore

from hppctl.runtime.worker import StoreArrivals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    timeout = datetime.timedelta(seconds=10)
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
    arrivals = StoreArrivals(TCPStore("127.0.0.1", server.port, is_master=False, timeout=timeout), "a")
    for r in range(50):  # connections and the store's first keys
        arrivals.reached(r)
    begin = time.perf_counter()
    for r in range(50, 50 + args.rounds):
        arrivals.reached(r)
    per_round = (time.perf_counter() - begin) / args.rounds
    print(f"StoreArrivals.reached: {per_round * 1e6:.0f} us a round (set + delete_key, loopback TCPStore, "
          f"{args.rounds} rounds)")


if __name__ == "__main__":
    main()
