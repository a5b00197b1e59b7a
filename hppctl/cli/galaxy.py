"""Collaborative inference (Galaxy) behind `hppctl profile --seq-len`, `hppctl plan` on an inference
profile, and `hppctl run` on an inference plan. The commands' own modules call these; docs/galaxy.md.

    hppctl profile --cluster C.yaml --model bert-large --seq-len 284 --out prof.json
    hppctl plan --profile prof.json --strategy galaxy --seq-len 284 --out galaxy.yaml
    hppctl plan --profile prof.json --seq-len 284 --compare
    hppctl run --plan galaxy.yaml --cluster C.yaml --seq-len 284 --repeat 5 --output h.pt --json
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from rich.table import Table

from hppctl.cli.flags import positive
from hppctl.cli.output import PhaseDisplay, emit_json, note, progress_log, stdout
from hppctl import driver
from hppctl.errors import BadInput
from hppctl.models.units import format_bytes


def is_inference_file(path: Path) -> bool:
    """True when `path` holds an inference profile or plan (`kind: inference`)."""
    from hppctl.store import read_document

    return is_inference_document(read_document(path))


def is_inference_document(document: object) -> bool:
    """True for a parsed inference profile or plan (`kind: inference`)."""
    return isinstance(document, dict) and document.get("kind") == "inference"


def parse_seq_lens(text: str) -> list[int]:
    values = []
    for part in text.split(","):
        try:
            value = int(part.strip())
        except ValueError:
            raise BadInput(f"--seq-len: {part.strip()!r} is not a whole number (in {text!r})") from None
        if value <= 0:
            raise BadInput(f"--seq-len: {value} is not a positive number of tokens")
        positive("--seq-len", value)  # at most 10^9 tokens
        values.append(value)
    return sorted(set(values))


# --- profile ------------------------------------------------------------------------------------------

def profile_inference(cluster: Path, model: str, seq_len: str, *, layers: int | None, out: Path | None,
                      as_json: bool, repeats: int, warmup: int, threads: int | None, timeout: float) -> None:
    from hppctl.models.cluster import ClusterSpec
    from hppctl.profiling.inference import inference_profile
    from hppctl.store import load, save

    if out is None and not as_json:
        raise BadInput("--out: give a file for the profile (or --json to print it)")
    inventory = load(cluster, ClusterSpec)

    def progress(device: str, record: dict[str, Any]) -> None:
        if record.get("type") == "blocks":
            note(f"{device}: blocks timed at sequence length {record['seq_len']}")

    lengths = parse_seq_lens(seq_len)
    profile = inference_profile(inventory, model, lengths, layers=layers, repeats=repeats,
                                warmup=warmup, threads=threads, timeout_s=timeout, on_record=progress)
    if sum(d.source == "measured" for d in profile.devices) >= 2:
        from hppctl.runtime.galaxy.calibrate import calibrate_comm_cpu

        note("measuring each device's CPU per byte of communication over the links (two one-layer runs)")
        profile = calibrate_comm_cpu(profile, inventory, seq_len=max(lengths), threads=threads or 0, timeout_s=timeout)
    if out is not None:
        save(out, profile)
        note(f"wrote {out}")
    if as_json:
        emit_json(profile.model_dump(mode="json") if out is None else _profile_summary(profile, out))
        return
    _render_profile(profile)


def _profile_summary(profile, out: Path) -> dict[str, Any]:
    return {"out": str(out), "model": profile.model, "source": profile.source, "layers": profile.num_layers,
            "devices": [{"name": d.name, "kind": d.kind, "memory_bytes": d.memory_bytes,
                         "seq_lens": [t.seq_len for t in d.timings]} for d in profile.devices]}


def _render_profile(profile) -> None:
    table = Table(box=None, pad_edge=False, title=f"{profile.model}: one layer's blocks ({profile.source})")
    for col in ("device", "seq len", f"attention ({profile.heads} heads) s", f"MLP ({profile.intermediate} cols) s",
                "connective (all rows) s", "budget"):
        table.add_column(col)
    for d in profile.devices:
        for t in d.timings:
            table.add_row(d.name, str(t.seq_len), f"{t.attention.seconds[-1]:.4f}", f"{t.mlp.seconds[-1]:.4f}",
                          f"{t.connective.seconds[-1]:.5f}", format_bytes(d.memory_bytes))
    stdout.print(table)
    stdout.print(f"weights per layer: attention {format_bytes(profile.attention_bytes)}, MLP {format_bytes(profile.mlp_bytes)}; "
                 f"{profile.num_layers} layers")


# --- plan ---------------------------------------------------------------------------------------------

def plan_inference(profile_path: Path, strategy: str, seq_len: int | None, *, out: Path | None, compare: bool,
                   as_json: bool) -> None:
    from hppctl.models.inference import InferenceProfile
    from hppctl.planner.galaxy import compare_inference, make_inference_plan
    from hppctl.store import load, save

    profile = load(profile_path, InferenceProfile)
    if compare:
        rows = compare_inference(profile, seq_len)
        if as_json:
            emit_json([{"strategy": name, "feasible": plan is not None and not plan.memory_violations,
                        "note": why, "plan": plan.model_dump(mode="json") if plan else None} for name, plan, why in rows])
        else:
            _render_compare(rows)
        return
    plan = make_inference_plan(profile, strategy, seq_len)
    if out is not None:
        save(out, plan)
        note(f"wrote {out}")
    if as_json:
        emit_json(plan.model_dump(mode="json"))
    else:
        _render_plan(plan)


def _faster_by(own_s: float, chosen_s: float) -> str:
    gain = 1 - own_s / chosen_s
    return f"{gain:.1%} faster" if gain > 0 else "no faster"


def _overlap_note(plan) -> str:
    """Which ring collectives overlap their GEMM (galaxy chooses per collective from the profile)."""
    if plan.strategy != "galaxy" or len(plan.shares) < 2:
        return ""
    if plan.own_latency_s is not None:
        from hppctl.planner.inference_costs import EQUAL_SPLIT_MARGIN

        return (f" (Megatron's program on its equal shares: galaxy's own plan predicted "
                f"{_faster_by(plan.own_latency_s, plan.prediction.latency_s)}, inside the "
                f"{EQUAL_SPLIT_MARGIN:.0%} a profile resolves)")
    if plan.collective == "all-reduce":
        return " (galaxy's split on gloo's AllReduce: predicted faster than its rings)"
    from hppctl.models.inference import BLOCK_COLLECTIVES

    flags = plan.overlap_by_block()
    if all(flags):
        return ", tile overlap"
    if not any(flags):
        return ", no tile overlap (predicted no faster)"
    return ", tile overlap on " + " ".join(n for n, f in zip(BLOCK_COLLECTIVES, flags) if f)


def _render_plan(plan) -> None:
    pred = plan.prediction
    stdout.print(f"{plan.strategy} plan for {plan.model}: {plan.num_layers} layers at sequence length {plan.seq_len}, "
                 f"sync {plan.sync}{_overlap_note(plan)}")
    table = Table(box=None, pad_edge=False)
    for col in ("device", "heads", "MLP columns", "rows", "speed (layers/s)", "weights / budget"):
        table.add_column(col)
    for s in plan.shares:
        table.add_row(s.device, str(s.heads), str(s.columns), str(s.rows), f"{s.capacity:.2f}",
                      f"{format_bytes(s.memory_bytes)} / {format_bytes(s.memory_budget_bytes)}")
    stdout.print(table)
    stdout.print(f"predicted latency {pred.latency_s:.3f} s (compute {pred.compute_s:.3f} s, communication "
                 f"{pred.communication_s:.3f} s of which exposed {pred.exposed_communication_s:.3f} s); "
                 f"planned in {plan.planning_time_s * 1e3:.1f} ms")
    for v in plan.memory_violations:
        stdout.print(f"does not fit: {v.device} needs {format_bytes(v.needed_bytes)} of weights, its budget is "
                     f"{format_bytes(v.budget_bytes)}")


def _render_compare(rows) -> None:
    table = Table(box=None, pad_edge=False, title="inference strategies, fastest feasible first")
    for col in ("strategy", "feasible", "predicted latency s", "heads", "MLP columns", "rows"):
        table.add_column(col)
    for name, plan, why in rows:
        if plan is None:
            table.add_row(name, "no plan", "-", "-", "-", why[:60])
            continue
        table.add_row(name, "out of memory" if plan.memory_violations else "yes", f"{plan.prediction.latency_s:.3f}",
                      "/".join(str(s.heads) for s in plan.shares), "/".join(str(s.columns) for s in plan.shares),
                      "/".join(str(s.rows) for s in plan.shares))
    stdout.print(table)


# --- run ----------------------------------------------------------------------------------------------

def run_inference_command(plan_path: Path, cluster_path: Path, *, text: str | None, input_ids: Path | None,
                          seq_len: int | None, repeat: int, warmup: int, overlap: bool, output: Path | None,
                          as_json: bool, threads: int | None, seed: int, listen: str | None, timeout: float,
                          log: Path | None, wire_dtype: str = "float32", log_every: float | None = None,
                          precision: str = "fp32", user_code=None) -> None:
    """`user_code`: the run's `--workdir` (runtime/workdir.py `user_code`), or None."""
    import os

    from hppctl.models.cluster import ClusterSpec
    from hppctl.models.inference import InferencePlan
    from hppctl.runtime.galaxy.launch import InferenceRequest, run_inference
    from hppctl.runtime.progress import report_every
    from hppctl.store import load, open_output_stream

    given = [flag for flag, v in (("--input", text), ("--input-ids", input_ids), ("--seq-len", seq_len)) if v is not None]
    if len(given) > 1:
        raise BadInput(f"{' and '.join(given)}: give one input (text, a token-id file, or a length for random ids)")
    for flag, value, low in (("--repeat", repeat, 1), ("--warmup", warmup, 0), ("--seq-len", seq_len, 1)):
        if value is not None and value < low:
            raise BadInput(f"{flag}: must be at least {low} (got {value})")
        positive(flag, value, allow_zero=True)  # and at most 10^9: --repeat 10**30 never ended
    if wire_dtype not in ("float32", "float16"):
        raise BadInput(f"--wire-dtype: unknown value {wire_dtype!r} (float32 or float16)")
    if output is not None and output.suffix.lower() != ".pt":
        raise BadInput(f"--output: {output}: use a .pt file (torch.save of the [sequence, hidden] tensor)")
    plan = load(plan_path, InferencePlan)
    inventory = load(cluster_path, ClusterSpec)
    known = set(plan.devices()) <= {d.name for d in inventory.devices}
    if known:
        from hppctl.runtime.launch import prepare_local_workers
        # the local workers' zygote, before the tokenizer and any torch work (runtime/zygote.py ForkedZygote)
        prepare_local_workers(inventory, [s.device for s in plan.shares], fork_from_here=True)
    ids = (driver.text_ids(plan.model, text, note) if text is not None
           else driver.read_input_ids(input_ids) if input_ids else None)
    if known:
        from hppctl.runtime.accelerator import check_local_devices
        check_local_devices(inventory, [s.device for s in plan.shares], precision, cluster_source=str(cluster_path))
    local = [s.device for s in plan.shares if inventory.device(s.device).local] if known else []
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // len(local)) if local and len(local) == len(plan.shares) else 0
    with contextlib.ExitStack() as stack:  # the log file closed last, whatever happens
        log_file = stack.enter_context(open_output_stream(log, append=True)) if log else None
        lines = progress_log(log_every)
        shown = InferenceProgress(lines, warmup, repeat)
        stack.enter_context(lines or contextlib.nullcontext())
        request = InferenceRequest(plan, inventory, ids, seq_len=seq_len, overlap=overlap, wire_dtype=wire_dtype,
                                   repeats=repeat, warmup=warmup, threads=threads, seed=seed, timeout_s=timeout,
                                   listen=listen, log=log_file, progress_every_s=report_every(log_every),
                                   precision=precision)
        try:
            result = run_inference(request, on_phase=shown.on_phase, on_step=shown.on_step, user_code=user_code)
        except BaseException:
            shown.close(failed=True)
            raise
        shown.close()
    summary = {"plan": str(plan_path), **result.summary()}
    if user_code is not None and user_code.workdir is not None:
        summary["workdir"] = user_code.summary()
        note(user_code.line())
    if output is not None:
        driver.save_tensor(output, result.output)
        summary["output"] = str(output)
    emit_json(summary) if as_json else _render_run(summary)


class InferenceProgress:
    """The phases of an inference run on stderr (cli/output.py `PhaseDisplay`): building the model
    and cutting its shards, starting the workers, then the passes (warm-up first) as they report."""

    TITLES = {"model": "model and shards", "workers": "workers", "passes": "passes"}

    def __init__(self, lines, warmup: int, repeats: int) -> None:
        self.lines, self.warmup, self.passes = lines, warmup, warmup + repeats
        self.display: PhaseDisplay | None = None

    def on_phase(self, name: str) -> None:
        self.close()
        total = self.passes if name == "passes" else None
        self.display = PhaseDisplay(self.lines, self.TITLES.get(name, name), total=total,
                                    unit="passes" if total else "")

    def on_step(self, step) -> None:
        if self.display is not None:
            kind = "warm-up" if step.done <= self.warmup else "timed"
            self.display.update(step.done, f"pass {step.done}/{step.total} ({kind})")

    def close(self, failed: bool = False) -> None:
        if self.display is not None:
            self.display.close(failed=failed)
            self.display = None


def _render_run(summary: dict[str, Any]) -> None:
    lat = summary["latency_s"]
    shape = ", ".join(f"{s['device']} {s['heads']}h/{s['columns']}c/{s['rows']}r" for s in summary["shares"])
    mode = ", all-reduce" if summary.get("collective") == "all-reduce" else ", overlap" if summary["overlap"] else ""
    stdout.print(f"{summary['model']} ({summary['strategy']}{mode}): "
                 f"{summary['layers']} layers, {summary['seq_len']} tokens on {shape}")
    stdout.print(f"latency median {lat['median']:.4f} s (min {lat['min']:.4f}, max {lat['max']:.4f}, "
                 f"{summary['repeats']} passes; plan predicted {summary['predicted_latency_s']:.4f} s)")
    table = Table(box=None, pad_edge=False, title="per device, median pass")
    for col in ("device", "host", "latency s", "compute s", "communication s", "exposed comm s", "sent", "peak RSS"):
        table.add_column(col)
    for d, m in summary["devices"].items():
        table.add_row(d, m["host"], f"{m['median_latency_s']:.4f}", f"{m['median_compute_s']:.4f}",
                      f"{m['communication_s']:.4f}", f"{m['median_exposed_comm_s']:.4f}",
                      format_bytes(m["bytes_sent"]) if m["bytes_sent"] else "0", format_bytes(m["peak_rss_bytes"]))
    stdout.print(table)
    stdout.print("compute = latency - exposed; communication = bytes sent / the ring's slowest link (inventory); "
                 "exposed = time blocked on the network")
    if summary.get("output"):
        note(f"final hidden states: {summary['output']}")
