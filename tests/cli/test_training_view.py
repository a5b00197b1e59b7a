"""`hppctl run`'s training bar (cli/view.py `TrainingView`, a real rich Progress) on a resumed run."""

from hppctl.cli.view import TrainingView
from hppctl.driver import RunView, run_session


def test_the_bar_of_a_resumed_run_starts_at_its_checkpoints_round():
    """A cron start of rounds 3-4 of 4 drew 0/4 until its first round ended, then jumped to 3/4."""
    view = TrainingView()
    with view.training(4, False):
        task = view.progress.tasks[0]
        view.resumed_after(2)
        assert (task.completed, task.total) == (2, 4)
        view.round_done({"round": 2, "loss": 0.5, "samples_per_s": 100.0}, "round", 4)
        assert task.completed == 3
    assert task.completed == 4


class Recording(RunView):
    def __init__(self):
        self.calls = []

    def resumed_after(self, done):
        self.calls.append(("resumed_after", done))

    def began(self, name, detail):
        self.calls.append(("began", name, detail))


class PhasesOnly:
    """Stands in for a runtime session (which starts real workers): it only reports its phases, as
    `Session.run` does once it has read the checkpoint's round."""

    def __init__(self, start_round):
        self.start_round, self.topo = start_round, type("Topo", (), {"devices": ["a", "b"]})()

    def run(self, on_round, on_event):
        self.on_phase("workers")
        self.on_phase("training")
        return "result"


def test_the_driver_tells_the_view_where_a_resumed_run_starts_before_its_training_phase():
    for start, expected in ((2, [("began", "workers", "2 workers"), ("resumed_after", 2),
                                 ("began", "training", "rounds 3-4 of 4")]),
                            (0, [("began", "workers", "2 workers"), ("began", "training", "4 rounds")])):
        view = Recording()
        assert run_session(PhasesOnly(start), view, 4, None, "round", False) == "result"
        assert view.calls == expected
