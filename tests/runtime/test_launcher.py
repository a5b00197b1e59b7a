"""The launcher skeleton (runtime/launcher.py) with real worker processes: a stand-in worker module
(tests/runtime/launcher_worker.py) joins over the run's store as every worker does, so these cases
check what every run kind shares — admission, rounds read once and in order, failure messages,
stopping every worker — without training anything."""

import subprocess
import sys

import pytest
from pydantic import BaseModel

from hppctl.errors import Infeasible
from hppctl.runtime import wire
from hppctl.runtime.launcher import Launcher, WorkerFailed, add_row
from tests.runtime.factories import local_cluster

pytestmark = pytest.mark.timeout(120)


class StandInConfig(BaseModel):
    device: str
    store_host: str
    store_port: int
    action: str
    rounds: int = 0


class Request:
    def __init__(self, devices):
        self.cluster, self.listen, self.log, self.env = local_cluster(*devices), None, None, {}


class StandInReport(BaseModel):
    round: int
    device: str


class StandInRun(Launcher):
    worker_module = "tests.runtime.launcher_worker"
    report_type = StandInReport

    def __init__(self, actions: dict[str, str], rounds: int = 0) -> None:
        super().__init__(Request(list(actions)))
        self.actions, self.rounds = actions, rounds

    def _devices(self) -> list[str]:
        return list(self.actions)

    def run(self) -> tuple:
        return self._run_workers(30.0, ship=lambda store: None, config_of=self._config, collect=self._collect)

    def _config(self, device: str) -> StandInConfig:
        return StandInConfig(device=device, store_host=self.store.host, store_port=self.store.port,
                             action=self.actions[device], rounds=self.rounds)

    def _collect(self) -> tuple:
        rows = []
        while len(rows) < self.rounds or not self._all_done():
            self._check_alive()
            if len(rows) < self.rounds and (reports := self._take_round(len(rows))) is not None:
                add_row(rows, sorted((d, r.round) for d, r in reports.items()), None)
        left = [wire.metrics(r, d) for r in range(self.rounds) for d in self.actions]
        return rows, [key for key in left if self.store.store.check([key])]


def test_rounds_are_read_once_in_order_and_every_worker_is_stopped():
    run = StandInRun({"a": "rounds", "b": "rounds"}, rounds=3)
    rows, left = run.run()
    assert rows == [[("a", r), ("b", r)] for r in range(3)]
    assert left == []  # every report deleted once read
    assert all(w.poll() is not None for w in run.workers.values())


def test_a_worker_exiting_with_an_error_fails_the_run_naming_it_and_stops_the_others():
    run = StandInRun({"a": "wait", "b": "exit 3"})
    with pytest.raises(WorkerFailed, match=r"(?s)^worker on device b failed \(exit 3\).*b: giving up"):
        run.run()
    assert run.workers["a"].poll() is not None  # stopped, not left waiting 60 s


def test_a_reported_infeasible_plan_is_infeasible_when_reports_fail_the_run():
    class Reporting(StandInRun):
        fail_on_report = True
        worker_noun = "stand-in worker"

    with pytest.raises(Infeasible, match="^needs 2 GiB of 1 GiB$"):
        Reporting({"a": "wait", "b": "report Infeasible: needs 2 GiB of 1 GiB"}).run()
    with pytest.raises(WorkerFailed, match=r"^stand-in worker on device b failed: RuntimeError: no"):
        Reporting({"a": "wait", "b": "report RuntimeError: no"}).run()


def test_checkpoint_reads_lineage_without_importing_the_session():
    code = ("import sys; from hppctl.runtime.checkpoint import plan_to_resume; "
            "from tests.runtime.factories import make_plan; "
            "plan = make_plan('tiny-mlp', [((0, 2), ['a'], [8])], global_batch=8, micro_batch=8); plan_to_resume(None, plan); "
            "print('hppctl.runtime.session' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_session_still_exports_the_names_that_moved():
    from hppctl.runtime import launcher, lineage, session

    for name in ("Lineage", "run_fingerprint", "resume_fingerprint", "plan_document", "plan_digest"):
        assert getattr(session, name) is getattr(lineage, name)
    assert session.WorkerFailed is launcher.WorkerFailed


def test_a_worker_that_cannot_be_stopped_is_one_warning_line(capsys):
    """Stopping an SSH worker reads its pid from the run's store; once the store's address is gone the
    read fails with torch's error, whose C++ trace (dozens of lines) was printed whole per worker."""
    from hppctl.runtime.launch import stop_workers

    class Unstoppable:  # a stand-in WorkerProcess whose stop meets the store's failure
        device = "a"

        def stop(self) -> None:
            raise RuntimeError("Failed to recv, got 0 bytes.\nException raised from recvBytes at Utils.hpp:787\n"
                               "frame #0: c10::Error::Error(...)")

    stop_workers([Unstoppable()])
    assert capsys.readouterr().err == "warning: could not stop worker a: Failed to recv, got 0 bytes.\n"
