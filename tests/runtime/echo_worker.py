"""A stand-in worker module for tests/runtime/test_local_start.py: it echoes what a worker is given
(its stdin payload, an environment variable, its directory, whether it runs as `__main__`), then
exits with the code the payload asks for, or sleeps until it is signalled."""

import json
import os
import sys
import time

doc = json.loads(sys.stdin.readline())
print(json.dumps({"payload": doc, "env": os.environ.get("HPPCTL_ECHO"), "cwd": os.getcwd(), "name": __name__,
                  "session_leader": os.getsid(0) == os.getpid()}), flush=True)
if doc.get("threads"):
    import torch

    print(json.dumps({"threads": torch.get_num_threads(), "pid": os.getpid(), "ppid": os.getppid()}), flush=True)
if doc.get("sleep"):
    time.sleep(doc["sleep"])
sys.exit(doc.get("exit", 0))
