"""`hppctl check`: a smoke test of this installation and of a cluster, for CI and for a new cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from hppctl.cli.flags import seconds
from hppctl.cli.output import emit_json, stderr, stdout

EXAMPLES = """
Examples (from the repository root; files in examples/):

\b
  hppctl check                                 # this install and 3 local workers: pass or fail, about 10 s
  hppctl check --cluster examples/local.yaml   # the devices of a cluster file (local: or host:)
  hppctl check --cluster examples/local.yaml --json --timeout 30

Exit status: 0 passed, 1 a step failed (an unreachable device, a worker that failed, a loss that did
not fall), 2 bad input (a cluster file to fix, a host name that does not resolve, a host key refused).
"""


def check_command(
    cluster: Annotated[Optional[Path], typer.Option("--cluster", help="Cluster inventory to check (local: and host: devices; default: 3 local workers).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds a device has to answer, and workers to join and to pass any tensor (1 to 2592000).")] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout: each step and the verdict.")] = False,
) -> None:
    """Smoke test: install sanity, every device reachable with this hppctl version, and a 12-round training of a tiny model across all devices that must learn. Exit 0 pass, 1 fail, 2 bad input."""
    from hppctl.check import Step, local_cluster, refuse_presets, run_check
    from hppctl.models.cluster import ClusterSpec
    from hppctl.store import load

    seconds("--timeout", timeout)
    if cluster is None:
        inventory, source = local_cluster(), "3 local workers (no --cluster)"
    else:
        inventory, source = load(cluster, ClusterSpec), str(cluster)
        refuse_presets(inventory, source)
    console = stderr if as_json else stdout

    def show(step: Step) -> None:
        console.print(f"{'ok  ' if step.ok else 'FAIL'} {step.name:<8} {step.detail} ({step.seconds:.1f} s)",
                      markup=False, soft_wrap=True)

    report = run_check(inventory, source=source, timeout_s=timeout, on_step=show)
    console.print(report.verdict(), markup=False, soft_wrap=True)
    if as_json:
        emit_json(report.document())
    if report.exit_code:
        raise typer.Exit(report.exit_code)


def register(app: typer.Typer) -> None:
    app.command("check", help=(check_command.__doc__ or "") + "\n" + EXAMPLES)(check_command)
