"""Forked by a zygote in test_local_start.py: prints whether this process holds tiny-mlp's trace already."""

import json

from hppctl.zoo import is_traced

print(json.dumps({"traced": is_traced("tiny-mlp")}), flush=True)
