"""One module per strategy; importing this package registers them all."""

from hppctl.planner.strategies import asteroid, dapple, dp, pipedream, pp  # noqa: F401
