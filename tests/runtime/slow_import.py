"""A module whose import takes a minute: a stand-in for a zygote's torch import (test_local_start.py)."""

import time

time.sleep(60)
