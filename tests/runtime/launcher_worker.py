"""A stand-in worker module for tests/runtime/test_launcher.py: it joins a run the way every worker
does (connect to the store, write its pid, prove the token, wait for `start`), then does what its
config's `action` says: report rounds and finish, print a line and exit with a code, or report an
error and wait to be stopped."""

import json
import os
import socket
import sys
import time

from hppctl.runtime import bootstrap, wire

doc = json.loads(sys.stdin.readline())
config = doc["config"]
device = config["device"]
store = bootstrap.connect_store(config["store_host"], config["store_port"], doc["token"], timeout_s=60)
store.set(wire.pid(device), f"{socket.gethostname()} {os.getpid()}")
bootstrap.join(store, doc["token"], device, timeout_s=60)
action = config["action"]
if action == "rounds":
    for r in range(config["rounds"]):
        store.set(wire.metrics(r, device), json.dumps({"round": r, "device": device}))
    store.set(wire.done(device), "1")
elif action.startswith("exit "):
    print(f"{device}: giving up", flush=True)
    sys.exit(int(action.split()[1]))
elif action.startswith("report "):
    store.set(wire.failed(device), action.removeprefix("report "))
    time.sleep(60)
else:
    time.sleep(60)
