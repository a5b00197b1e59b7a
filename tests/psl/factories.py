"""Small readable PSL instances: integer times straight into `PslTimes`, no profile needed."""

from __future__ import annotations

import numpy as np

from hppctl.models.psl import PslRequest, PslTimes

GB = 10**9


def make_times(r, p, l, lp, pp, rp, *, demand=None, capacity=None) -> PslTimes:
    """Each argument is a [helper][client] table (or a scalar / per-client list broadcast to one)."""
    shape = np.asarray(p, dtype=float).shape if np.ndim(p) == 2 else None
    if shape is None:
        for a in (r, l, lp, pp, rp):
            if np.ndim(a) == 2:
                shape = np.asarray(a).shape
                break
    I, J = shape

    def table(a):
        return np.broadcast_to(np.asarray(a, dtype=float), (I, J)).tolist()

    return PslTimes(r_s=table(r), p_s=table(p), l_s=table(l), l_prime_s=table(lp), p_prime_s=table(pp),
                    r_prime_s=table(rp), demand_bytes=list(demand or [GB] * J), capacity_bytes=list(capacity or [100 * GB] * I))


def request_for(times: PslTimes, batch: int = 8) -> PslRequest:
    J, I = times.num_clients, times.num_helpers
    return PslRequest(clients=[f"c{j}" for j in range(J)], helpers=[f"h{i}" for i in range(I)],
                      cuts=[[1, 2]] * J, batch=batch)


def random_times(seed: int, clients: int, helpers: int, *, high: int = 4) -> PslTimes:
    """Integer times (slots): small, so the exact program and brute force stay fast."""
    rng = np.random.default_rng(seed)
    shape = (helpers, clients)
    speed = rng.integers(1, 3, size=(helpers, 1))  # helper speed class: unrelated machines, mildly
    return make_times(rng.integers(0, high, size=(1, clients)).repeat(helpers, 0), rng.integers(1, high, size=shape) * speed // speed.min(),
                      rng.integers(0, 3, size=(1, clients)).repeat(helpers, 0), rng.integers(0, 3, size=(1, clients)).repeat(helpers, 0),
                      rng.integers(1, high, size=shape), rng.integers(0, high + 2, size=(1, clients)).repeat(helpers, 0))


def preset_times(kind: int, clients: int, helpers: int, seed: int, model: str = "mobilenetv2"):
    """The paper's scenarios on hppctl presets (as bench/psl.py): 1 = device types drawn at random,
    one cut; 2 = also device speeds scaled by [0.5, 2], helper memory 10-100 %, random cuts and links."""
    from hppctl.driver import spec_profile
    from hppctl.models.psl import PslSpec
    from hppctl.planner.psl import pair_times

    rng = np.random.default_rng(seed)
    spec = {"name": "t", "model": model, "cut": [3, 15], "batch": 32, "bandwidth": "50mbit",
            "clients": [{"name": f"c{j}", "preset": str(p)} for j, p in
                        enumerate(rng.choice(["rpi4", "jetson-nano", "jetson-tx2"], clients))],
            "helpers": [{"name": f"h{i}", "preset": str(p)} for i, p in
                        enumerate(rng.choice(["laptop-cpu", "jetson-nx", "jetson-orin-nano"], helpers))]}
    if kind == 2:
        for c in spec["clients"]:
            c["cut"] = [int(rng.integers(1, 5)), int(rng.integers(12, 17))]
            c["bandwidth"] = f"{rng.uniform(10, 100):.1f}mbit"
    psl = PslSpec.model_validate(spec)
    profile = spec_profile(psl, "test")
    if kind == 2:
        devices = []
        for d in profile.devices:
            f = float(rng.uniform(0.5, 2.0))
            update = {"forward_s": [[t * f for t in row] for row in d.forward_s],
                      "backward_s": [[t * f for t in row] for row in d.backward_s]}
            if d.name.startswith("h"):
                update["memory_bytes"] = int(d.memory_bytes * rng.uniform(0.1, 1.0))
            devices.append(d.model_copy(update=update))
        profile = profile.model_copy(update={"devices": devices})
    return pair_times(profile, psl.request()), psl.request()


def heterogeneous_times(seed: int, clients: int, helpers: int) -> PslTimes:
    """Seconds, as `pair_times` composes them (docs/psl.md, The six times), with every device and
    every client-helper link drawn at random: client compute speed, helper speed, link bandwidth
    per pair, so r, l, l′ and r′ differ per helper too. Every third seed binds helper memory."""
    rng = np.random.default_rng(seed)
    client = rng.uniform(0.5, 3.0, size=(1, clients))                 # client seconds per unit of work
    helper = rng.uniform(0.1, 2.0, size=(helpers, 1))                 # helper seconds per unit of work
    link = rng.uniform(0.05, 2.0, size=(helpers, clients))            # seconds per unit of data
    work1, work2, work3 = rng.uniform(0.2, 1.0, size=(3, 1, clients))  # part 1, 2, 3 forward work
    up, down = rng.uniform(0.2, 1.0, size=(2, 1, clients))            # boundary data at σ1, σ2
    r = client * work1 + link * up
    p = helper * work2
    l = link * down + client * work3
    lp = 2 * client * work3 + link * down
    pp = 2 * helper * work2
    rp = link * up + 2 * client * work1
    demand, capacity = None, None
    if seed % 3 == 2:  # memory binds: each helper holds only some of the clients
        demand = [int(d) for d in rng.integers(1, 4, size=clients) * GB]
        capacity = [int(c) for c in rng.integers(3, 7, size=helpers) * GB]
        while sum(capacity) < sum(demand):
            capacity[0] += GB
    return make_times(r, p, l, lp, pp, rp, demand=demand, capacity=capacity)
