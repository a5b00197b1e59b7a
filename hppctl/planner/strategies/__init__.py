"""One module per strategy; importing this package registers them all."""

from hppctl.planner.strategies import asteroid, bipartition, dapple, dp, pipedream, pp  # noqa: F401
