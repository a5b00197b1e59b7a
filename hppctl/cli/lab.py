"""`hppctl lab up|status|down`: an emulated edge cluster on this Linux machine (needs root)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from hppctl.cli.output import emit_json, note, stdout, writable_path
from hppctl.models.units import format_bytes, format_rate

EXAMPLES = """
Examples (as root, from the repository root):

\b
  hppctl lab up --spec examples/lab/env-d.yaml --out out/env-d.yaml
  hppctl lab status                       # hosts, addresses, limits, memory use, OOM kills, sshd answering
  ssh -F /run/hppctl-lab/env-d/ssh_config tx0 hostname
  hppctl lab fault nano1 kill             # also stop, cont, term, link-down, link-up: failures for a run
  hppctl lab fault nano1,tx0 link-down    # several hosts at once: devices that fail together
  hppctl lab down                         # safe to repeat, and after a crashed `up`
"""

StateDir = Annotated[Optional[Path], typer.Option(
    "--state-dir", help="Directory holding each lab's state (default /run/hppctl-lab, or $HPPCTL_LAB_STATE_DIR).")]
Name = Annotated[Optional[str], typer.Option("--name", help="The lab (default: the only one in the state dir).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def _root(state_dir: Optional[Path]) -> Path:
    from hppctl.lab.manager import DEFAULT_STATE_ROOT

    return state_dir if state_dir is not None else DEFAULT_STATE_ROOT


def up_command(
    spec: Annotated[Path, typer.Option("--spec", help="Lab spec (.yaml/.json): hosts, presets, limits, links.")],
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the lab's cluster file here (default: in the state dir).")] = None,
    state_dir: StateDir = None,
    cgroup_parent: Annotated[str, typer.Option("--cgroup-parent", help="Cgroup (relative to the hierarchy root) to create the lab's cgroups under.")] = "",
    as_json: AsJson = False,
) -> None:
    """Build an emulated edge cluster: a network namespace, sshd, tc shaping and a cgroup per host."""
    from hppctl.lab.manager import preflight, status, up
    from hppctl.models.lab import LabSpec
    from hppctl.store import load

    writable_path("--out", out)  # before reading the spec and building anything: building a lab is slow
    lab_spec = load(spec, LabSpec)
    preflight()
    note(f"building lab {lab_spec.name!r} ({len(lab_spec.hosts)} hosts)…")
    result = up(lab_spec, str(spec), _root(state_dir), out, cgroup_parent)
    for warning in result.warnings:
        note(f"warning: {warning}")
    report = status(_root(state_dir), lab_spec.name)[0]
    if as_json:
        emit_json(report)
        return
    _render(report)
    note(f"cluster file: {report['cluster_file']}")
    note(f"ssh: ssh -F {report['ssh_config']} {report['hosts'][0]['name']}")


def status_command(name: Name = None, state_dir: StateDir = None, as_json: AsJson = False) -> None:
    """List labs: hosts, addresses, limits, memory use, OOM kills, and whether each sshd answers."""
    from hppctl.lab.manager import status

    labs = status(_root(state_dir), name)
    if as_json:
        emit_json({"labs": labs})
        return
    if not labs:
        note(f"no lab is up (state dir {_root(state_dir)})")
    for report in labs:
        _render(report)


def down_command(
    name: Name = None,
    state_dir: StateDir = None,
    everything: Annotated[bool, typer.Option("--all", help="Remove every lab of the state dir, and anything on this "
                                                             "machine named like a lab, whoever made it.")] = False,
    as_json: AsJson = False,
) -> None:
    """Remove a lab: processes, namespaces, links, bridge, cgroups, state. Safe to run twice.

    Without --name: the only lab recorded in the state dir; other labs on the machine are listed, not touched."""
    from hppctl.lab.manager import down

    report = down(_root(state_dir), name, everything)
    if as_json:
        emit_json({"labs": report.labs, "removed": report.removed, "left_alone": report.left_alone})
        return
    for item in report.removed:
        note(f"removed {item}")
    note(f"lab down: {', '.join(report.labs) or f'no lab state found in {_root(state_dir)}'}; "
         f"{len(report.removed)} resources removed")
    if report.left_alone:
        note(f"left alone: other labs on this machine, not recorded in {_root(state_dir)}: "
             f"{', '.join(report.left_alone)} (their owner removes them with --name and their --state-dir)")


def fault_command(
    host: Annotated[str, typer.Argument(help="The lab host to hurt (a name from `hppctl lab status`), or several "
                                             "joined by commas, hurt together.")],
    action: Annotated[str, typer.Argument(
        help="kill (SIGKILL its hppctl workers), stop / cont (SIGSTOP / SIGCONT them), term (SIGTERM: "
             "a graceful leave), link-down / link-up (its eth0).")],
    name: Name = None,
    state_dir: StateDir = None,
    as_json: AsJson = False,
) -> None:
    """Inject a failure into a running lab: a crashed, hung or disconnected device (and undo it)."""
    from hppctl.lab.faults import inject_together
    from hppctl.lab.manager import the_lab
    from hppctl.lab.system import BASE_TOOLS, require

    require("hppctl lab fault", tools=tuple(t for t in BASE_TOOLS if t.command == "ip"))
    faults = inject_together(the_lab(_root(state_dir), name), host.split(","), action)
    if as_json:  # one host: its object, as before; several: a list of them
        docs = [{"host": f.host, "action": f.action, "pids": list(f.pids)} for f in faults]
        emit_json(docs[0] if len(docs) == 1 else docs)
        return
    for fault in faults:
        note(fault.describe())


def _render(report: dict) -> None:
    table = Table(title=f"lab {report['name']} ({'up' if report['complete'] else 'INCOMPLETE: run lab down'}, "
                        f"cgroup v{report['cgroup_version']}, delay: {report['delay_backend']})")
    for column in ("host", "address", "preset", "cpu", "memory", "used", "oom kills", "egress", "delay", "loss", "sshd"):
        table.add_column(column)
    for h in report["hosts"]:
        used = "-" if h["memory_used_bytes"] is None else format_bytes(h["memory_used_bytes"])
        # None when the host's cgroup is gone (a crashed or swept lab) or sets no limit
        limit = "-" if h["memory_limit_bytes"] is None else format_bytes(h["memory_limit_bytes"])
        table.add_row(
            h["name"], h["address"], h["preset"] or "-", f"{h['cpu']:g}", limit, used,
            str(h["oom_kills"] if h["oom_kills"] is not None else "-"), format_rate(h["bandwidth_bytes_per_s"]),
            f"{h['delay_s'] * 1e3:g} ms", f"{h['loss_percent']:g}%",
            "answers" if h["ssh_answers"] else ("running" if h["sshd_running"] else "DOWN"),
        )
    stdout.print(table)


def register(app: typer.Typer) -> None:
    lab = typer.Typer(name="lab", help="An emulated edge cluster on this Linux machine (needs root).\n" + EXAMPLES,
                      no_args_is_help=True, add_completion=False, rich_markup_mode=None)
    for name, command in (("up", up_command), ("status", status_command), ("fault", fault_command),
                          ("down", down_command)):
        lab.command(name, help=(command.__doc__ or "") + "\n" + EXAMPLES)(command)
    app.add_typer(lab, name="lab")
