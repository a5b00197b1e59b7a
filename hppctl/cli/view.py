"""How a run looks on the terminal: the `RunView`s the commands hand to the driver (hppctl/driver.py).

Bars on a terminal (rich), timestamped lines when `--log-every` or a non-terminal stderr asks for
them (`progress_log`), notes on stderr; stdout stays for the summary.
"""

from __future__ import annotations

import contextlib

from hppctl.cli.output import note, phase, stderr
from hppctl.driver import RunView


class LinesView(RunView):
    """Notes on stderr, phases as `PhaseDisplay`s, session phases and events on `lines` (a
    `ProgressLog`, or None: no timestamped lines)."""

    def __init__(self, lines=None) -> None:
        self.lines = lines

    def note(self, line: str) -> None:
        note(line)

    def phase(self, name: str, *, total: int | None = None, unit: str = ""):
        return phase(self.lines, name, total=total, unit=unit)

    def began(self, name: str, detail: str) -> None:
        if self.lines is not None:
            self.lines.begin(name, detail)

    def event(self, message: str) -> None:
        if self.lines is not None:
            self.lines.event(message)

    def ended(self) -> None:
        if self.lines is not None:
            self.lines.end()


class TrainingView(LinesView):
    """`hppctl run`'s training: a bar (with the coordinator's status table under fault tolerance)
    showing each round's loss and throughput and, within a round, its steps (a fractional position,
    so an nf1b epoch moves by micro-batch)."""

    def __init__(self, lines=None, *, describe=str) -> None:
        super().__init__(lines)
        self.describe = describe  # a fault event's line (cli/coordinator.py `describe`)
        self.progress = self.task = None
        self.figures = ""  # the last finished round's, repeated beside a step report

    @contextlib.contextmanager
    def training(self, total: int, fault_tolerant: bool):
        self.progress = status_progress(stderr, False)  # the status table shows once a coordinator sends one
        with self.progress:
            self.task = self.progress.add_task("rounds", total=total, status="starting workers")
            yield
            self.progress.update(self.task, completed=total)

    def resumed_after(self, done: int) -> None:
        # the bar of a resumed run starts at its checkpoint's round, not at 0 (it jumped at the first round)
        self.progress.update(self.task, completed=done)

    def round_done(self, row: dict, word: str, total: int) -> None:
        status = f"loss {row['loss']:.4f}  {row['samples_per_s']:.1f} samples/s"
        self.figures = f" (last {word}: {status.replace('  ', ' ')})"
        self.progress.update(self.task, completed=row["round"] + 1, status=status)
        if self.lines is not None:
            self.lines.update(f"{word} {row['round'] + 1}/{total} {status.replace('  ', ' ')}")

    def step(self, step, word: str, total: int) -> None:
        self.progress.update(self.task, completed=step.position(),
                             status=f"{word} {step.round + 1}: {step.step_name()} {step.done}/{step.total}")
        if self.lines is not None:
            self.lines.update(f"{word} {step.round + 1}/{total} {step.step_name()} {step.done}/{step.total}"
                              f"{self.figures}")

    def event(self, message: str) -> None:
        self.progress.update(self.task, status=message)
        super().event(message)

    def fault(self, event) -> None:
        self.event(self.describe(event))

    def status(self, rows: list[dict]) -> None:
        self.progress.rows = rows


class PslView(LinesView):
    """`hppctl psl run`: a line per round (on stderr, or on `lines` when given)."""

    def round_done(self, row: dict, word: str, total: int) -> None:
        worst = max(b["makespan_s"] for b in row["batches"])
        status = (f"round {row['round'] + 1}/{total}: loss {row['loss']:.4f}, "
                  f"slowest batch makespan {worst * 1e3:.1f} ms, FedAvg {row['fedavg_s'] * 1e3:.1f} ms")
        self.note(status) if self.lines is None else self.lines.update(status)

    def event(self, message: str) -> None:
        self.note(message) if self.lines is None else self.lines.event(message)


def status_progress(console, disable: bool):
    """A rich Progress that also shows the coordinator's status table under the bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from hppctl.ft.status import COLUMNS, render_rows

    class StatusProgress(Progress):
        rows: list[dict] = []

        def get_renderables(self):
            yield self.make_tasks_table(self.tasks)
            if self.rows:
                table = Table(*COLUMNS, box=None, pad_edge=False)
                for cells in render_rows(self.rows):
                    table.add_row(*cells)
                yield table

    return StatusProgress(TextColumn("[bold]training[/]"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=console,
                          disable=disable, transient=False)
