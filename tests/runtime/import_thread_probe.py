"""Imported by a zygote in test_local_start.py: writes which thread imported it to $IMPORT_THREAD_PROBE_OUT."""

import os
import threading

with open(os.environ["IMPORT_THREAD_PROBE_OUT"], "w") as out:
    out.write("main" if threading.current_thread() is threading.main_thread() else threading.current_thread().name)
