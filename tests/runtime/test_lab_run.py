"""`hppctl run` over SSH on a real 3-host edge lab (fabric, host-key checking, workers in each host's
namespaces and cgroup). Needs root; about a minute. Throughput and memory at the acceptance's scale:
bench/hpp_vs_baselines.py and docs/benchmarks.md. No wall-clock assertions.
"""

from __future__ import annotations

import pytest

from hppctl.models.cluster import ClusterSpec
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.session import RunRequest, Session
from hppctl.store import load
from tests.runtime.factories import make_plan
from tests.runtime.reference import train_reference
from tests.runtime.test_equivalence import assert_same

pytestmark = [pytest.mark.lab, pytest.mark.gloo, pytest.mark.timeout(600)]

NAME = "pytest-run"
SPEC = f"""\
name: {NAME}
bandwidth: 100mbit
subnet: {{subnet}}
hosts:
  - {{name: ra, cpu: 0.5, memory: 1GB}}
  - {{name: rb, cpu: 0.5, memory: 1GB}}
  - {{name: rc, cpu: 0.5, memory: 1GB}}
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from tests.lab.conftest import built_lab

    with built_lab(tmp_path_factory, NAME, SPEC) as built:
        yield load(built.cluster_file, ClusterSpec)


def test_training_over_ssh_equals_the_single_process_loop(lab):
    plan = make_plan("tiny-mlp", [((0, 2), ["ra", "rb"], [3, 1]), ((2, 5), ["rc"], [4])],
                     global_batch=16, micro_batch=4)
    options = TrainOptions(rounds=5, dataset="digits", lr=0.1)
    result = Session(RunRequest(plan, lab, options)).run()
    assert_same(result.model_state(), train_reference(plan, options))
    for device in ("ra", "rb", "rc"):
        worker = result.workers[device]
        assert worker["host"] == device  # the lab host's UTS namespace: the worker ran there
        assert worker["cgroup"].endswith(f"hppctl-lab-{NAME}/{device}")  # under the host's CPU quota


def _finished(worker, bound_s: float = 120.0) -> int | None:
    """The worker's exit code once it ended, polling at most `bound_s` (a bound, not a measurement)."""
    import time

    deadline = time.monotonic() + bound_s
    while (code := worker.poll()) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return code


def test_the_devices_python_and_env_are_one_word_each_on_the_remote_command_line(lab, tmp_path):
    """A `python:` path with a space and `;` (and an env value with both) reaches a real sshd as one
    word each: the interpreter starts, nothing after the `;` runs (issue 23, item 10)."""
    import json
    import sys
    from pathlib import Path

    from hppctl.runtime.launch import SshWorker

    odd = tmp_path / "py dir;echo INJECTED"
    odd.mkdir()
    (odd / "python").symlink_to(sys.executable)
    device = lab.device("ra").model_copy(update={"python": str(odd / "python")})
    repo = str(Path(__file__).resolve().parents[2])
    worker = SshWorker(device, lab, json.dumps({"exit": 0}), module="tests.runtime.echo_worker",
                       env={"PYTHONPATH": repo, "HPPCTL_ECHO": "a b;echo INJECTED"})
    assert _finished(worker) == 0, worker.tail()
    [echoed] = [json.loads(line) for line in worker.tail() if line.startswith("{")]
    assert echoed["env"] == "a b;echo INJECTED" and echoed["payload"] == {"exit": 0}
    assert not any(line.startswith("INJECTED") for line in worker.tail())


def test_a_host_key_missing_from_known_hosts_is_bad_input_naming_the_device(lab, tmp_path):
    from hppctl.errors import BadInput
    from hppctl.runtime.launch import SshWorker

    (tmp_path / "known_hosts").write_text("")
    cluster = lab.model_copy(update={"ssh": lab.ssh.model_copy(update={"known_hosts": str(tmp_path / "known_hosts")})})
    with pytest.raises(BadInput) as refused:
        SshWorker(cluster.device("rb"), cluster, "{}")
    assert "'rb'" in str(refused.value) and "not in" in str(refused.value) and "\n" not in str(refused.value)
