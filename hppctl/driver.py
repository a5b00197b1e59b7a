"""Plan in, result out: the one driver of a run, below the command line.

`hppctl run`, `hppctl psl run`, `hppctl coordinator`, `hppctl demo` and bench/ hand a checked plan
to `train` (or `train_psl`) and get the summary document back. What the run shows while it lasts
goes through a `RunView`: this base shows nothing, the CLI's subclass (cli/view.py) draws rich bars
and timestamped lines. Flag parsing and rendering stay in hppctl/cli/; nothing here imports it.
The other commands' library steps live here too: an inference request's token ids and its saved
output (`hppctl run` on an inference plan), every PSL method on one instance (`psl plan --compare`).
"""

from __future__ import annotations

import contextlib
import json
import statistics
from pathlib import Path

from hppctl.errors import BadInput, shorten
from hppctl.models.events import state_line


class RunView:
    """How a run shows itself. Every method is a no-op here (bench, tests, `hppctl check`)."""

    def note(self, line: str) -> None:
        """A line for people (the CLI's stderr)."""

    @contextlib.contextmanager
    def phase(self, name: str, *, total: int | None = None, unit: str = ""):
        """A step after training (saving, test pass, recalibration); yields `update(done)`."""
        yield lambda done: None

    @contextlib.contextmanager
    def training(self, total: int, fault_tolerant: bool):
        """The training phase's lifetime (a progress bar), entered once the checkpoint lock is held."""
        yield

    def began(self, name: str, detail: str) -> None:
        """The session entered phase `name` (workers, training)."""

    def resumed_after(self, done: int) -> None:
        """Training starts after the `done` rounds its checkpoint holds (a resumed run; before its phase)."""

    def round_done(self, row: dict, word: str, total: int) -> None:
        """A round (an epoch, `word`, for an asynchronous window) finished: its metrics row."""

    def step(self, step, word: str, total: int) -> None:
        """In-round progress (runtime/progress.py `StepProgress`)."""

    def event(self, message: str) -> None:
        """Something happened the user should see (a worker's note, a fault)."""

    def fault(self, event) -> None:
        """A fault-tolerance event (a `RunEvent` of models/events.py, from runtime/ft_session.py)."""

    def status(self, rows: list[dict]) -> None:
        """The coordinator's live status table."""

    def ended(self) -> None:
        """Training finished (not called when it failed)."""


# --- synchronous and asynchronous HPP training --------------------------------------------------------

def train(plan, cluster, options, data, *, view: RunView | None = None, checkpoint_dir=None, resume=False,
          metrics=None, trace=None, save_model=None, listen=None, log=None, plan_source="plan", schedule=None,
          recovery=None, lineage=None, bn_recalibrate=0, initial_state=None, expected_start=None,
          announce=None, user_code=None) -> dict:
    """Run the session; write metrics, trace and model; return the summary.

    announce: a line for the view once the run holds its checkpoint lock (the optimizer chosen for
    the user): after every refusal, which must stay the one `error:` line it is.
    schedule: an asynchronous window (runtime/async_exec/plans.py), whose rounds are epochs.
    recovery: `RecoveryOptions` for the embedded coordinator (docs/fault-tolerance.md), or None.
    bn_recalibrate: re-estimate BatchNorm statistics over this many training samples before saving
    and testing the model (0: keep the running averages the workers trained).
    initial_state, expected_start: `RunRequest`'s (runtime/session.py).
    user_code: the run's `--workdir` and user modules (`runtime.workdir.user_code`), or None."""
    from hppctl.runtime.results import save_model as write_model
    from hppctl.runtime.session import RunRequest, Session
    from hppctl.store import open_output_stream, write_text_atomic

    view = view or RunView()
    log_file = open_output_stream(log, append=True) if log else None  # appended to: a refused run adds nothing
    metrics_file = session = None
    try:
        request = RunRequest(plan, cluster, options, checkpoint_dir=checkpoint_dir, resume=resume,
                             listen=listen, log=log_file, schedule=schedule, lineage=lineage,
                             initial_state=initial_state, expected_start=expected_start)
        if recovery is not None:
            from hppctl.runtime.ft_session import FtSession
            session = FtSession(request, recovery)
        else:
            session = Session(request)
        session.user_code = user_code
        session.lock_checkpoint()  # another run active: exit 75 before any output, --metrics untouched
        if announce:
            view.note(announce)
        if metrics is not None:
            metrics_file = open_output_stream(metrics, append=resume)
        with view.training(options.rounds, recovery is not None):
            result = run_session(session, view, options.rounds, metrics_file,
                                 "epoch" if schedule is not None else "round", recovery is not None)
        view.ended()
    finally:
        if session is not None:
            session.unlock_checkpoint()
        for f in (metrics_file, log_file):
            if f is not None:
                f.close()
    state = result.model_state()
    recalibration = None
    if bn_recalibrate:
        state, recalibration = recalibrate(plan, options, data, state, bn_recalibrate, view)
    if save_model is not None or (trace is not None and result.trace is not None):
        with view.phase("saving"):
            if save_model is not None:
                write_model(plan.model, state, save_model)
            if trace is not None and result.trace is not None:
                write_text_atomic(trace, json.dumps(result.trace) + "\n")
    test_accuracy = test_pass(plan.model, state, data.test, view) if data.test is not None else None
    summary = summarize(plan, options, result, test_accuracy, plan_source=plan_source, checkpoint_dir=checkpoint_dir,
                        metrics=metrics, trace=trace, save_model=save_model)
    summary["bn_recalibration"] = recalibration
    summary["workdir"] = shipped_workdir(user_code, view)
    if recovery is not None:  # the plan the run ended with, and what happened on the way
        summary.update(events=session.events, final_stages=[{"layers": s.layers, "devices": s.devices,
                                                             "samples": s.samples} for s in session.plan.stages])
    return summary


def shipped_workdir(user_code, view: RunView) -> dict | None:
    """The summary's `workdir` (what each device was sent, runtime/workdir.py), told on `view` in one line."""
    if user_code is None or user_code.workdir is None:
        return None
    view.note(user_code.line())
    return user_code.summary()


def _write_row(metrics_file, row: dict) -> None:
    if metrics_file is not None:
        metrics_file.write(json.dumps(row) + "\n")
        metrics_file.flush()


def rounds_to_run(start: int, total: int, word: str) -> str:
    """The training phase's detail: "40 rounds", or what a resumed start runs, "rounds 21-40 of 40"
    (the total alone read as if the whole run were starting again)."""
    return f"{total} {word}s" if start == 0 else f"{word}s {start + 1}-{total} of {total}"


def _announce_phase(view: RunView, session, name: str, total: int, word: str) -> None:
    """Tell `view` a training session entered phase `name`: "workers" with their count, then training
    with the rounds it runs (a resumed run's bar first set to the rounds its checkpoint holds)."""
    if name == "workers":
        view.began(name, f"{len(session.topo.devices)} workers")
        return
    if session.start_round:
        view.resumed_after(session.start_round)
    view.began(name, rounds_to_run(session.start_round, total, word))


def run_session(session, view: RunView, total: int, metrics_file, word: str, fault_tolerant: bool):
    """`session.run` with its reports written to `metrics_file` (rows and, with fault tolerance,
    fault events and the coordinator's full event log) and shown on `view`. `word`: what a round is
    called ("epoch" for an asynchronous window)."""

    session.on_phase = lambda name: _announce_phase(view, session, name, total, word)

    def on_round(row: dict) -> None:
        _write_row(metrics_file, row)
        view.round_done(row, word, total)

    session.on_step = lambda step: view.step(step, word, total)
    if not fault_tolerant:
        return session.run(on_round=on_round, on_event=view.event)

    def on_fault(event) -> None:  # fault events go to --metrics beside the rounds
        _write_row(metrics_file, event.wire())
        view.fault(event)

    def on_state(event) -> None:  # the coordinator's full event log (it keeps only the last ones)
        if metrics_file is not None:
            metrics_file.write(json.dumps(state_line(event)) + "\n")

    return session.run(on_round=on_round, on_event=view.event, on_fault=on_fault, on_status=view.status,
                       on_state=on_state)


def test_pass(model: str, state: dict, split, view: RunView, name: str = "test pass") -> float:
    """Accuracy of `state` over `split`, shown as a phase."""
    from hppctl.runtime.results import accuracy, evaluation_batches

    with view.phase(name, total=evaluation_batches(split), unit="batches") as update:
        return accuracy(model, state, split, on_batch=lambda done, total: update(done))


test_pass.__test__ = False  # a library function, not a pytest test


def recalibrate(plan, options, data, state: dict, samples: int, view: RunView) -> tuple[dict, dict | None]:
    """Precise BatchNorm (runtime/results.py) over the first `samples` of epoch 0's sample order, in
    the plan's micro-batches; also the test accuracy with the trained running averages, for comparison."""
    from hppctl.runtime.data import SampleOrder
    from hppctl.runtime.results import recalibrate_batchnorm

    order = SampleOrder(len(data.train), plan.global_batch, plan.micro_batch, options.seed)
    indices = order.permutation(0)[:samples]
    with view.phase("BatchNorm recalibration", total=len(indices), unit="samples") as update:
        new = recalibrate_batchnorm(plan.model, state, data.train, indices, plan.micro_batch,
                                    on_batch=lambda done, total: update(done))
    if new is None:
        view.note(f"--bn-recalibrate: {plan.model} has no BatchNorm layer; the model is saved and tested as trained")
        return state, None
    before = (test_pass(plan.model, state, data.test, view, "test pass (running averages)")
              if data.test is not None else None)
    return new, {"samples": len(indices), "test_accuracy_running_averages": before}


def summarize(plan, options, result, test_accuracy, *, plan_source, checkpoint_dir, metrics, trace, save_model) -> dict:
    """The `--json` summary of a training run (docs/runtime.md "Outputs")."""
    rows = result.rounds
    steady = [r["samples_per_s"] for r in rows[1:]] or [r["samples_per_s"] for r in rows]
    predicted = {d: m for s in plan.stages for d, m in zip(s.devices, s.memory_bytes)}
    last = rows[-1] if rows else {}
    return {
        "plan": plan_source, "model": plan.model, "strategy": plan.strategy, "dataset": options.dataset,
        "stages": [{"layers": s.layers, "devices": s.devices, "samples": s.samples} for s in plan.stages],
        "global_batch": plan.global_batch, "micro_batch": plan.micro_batch,
        "start_round": result.start_round, "rounds": options.rounds, "rounds_run": len(rows),
        "loss": last.get("loss"), "train_accuracy": last.get("train_accuracy"), "test_accuracy": test_accuracy,
        "samples_per_s": statistics.median(steady) if steady else None,
        "predicted_samples_per_s": plan.prediction.throughput_samples_per_s,
        "wall_s": result.wall_s,
        "memory": {d: {**m, "predicted_bytes": predicted.get(d)} for d, m in result.workers.items()},
        "checkpoint_dir": str(checkpoint_dir) if checkpoint_dir else None,
        "metrics": str(metrics) if metrics else None, "trace": str(trace) if trace else None,
        "saved_model": str(save_model) if save_model else None,
    }


# --- what a run starts from ----------------------------------------------------------------------------

def plan_to_resume(checkpoint_dir: Path, plan, profile, plan_file: Path, rejoin: bool = False,
                   view: RunView | None = None):
    """(plan, profile, lineage) to resume on: a checkpoint that fault tolerance re-planned continues on
    its re-planned plan, over the profile of the devices left (the re-planned plan was made from it),
    unless `rejoin`; a checkpoint of another plan of the same model is re-cut to `plan`'s stages."""
    from hppctl.planner.replan import without_devices
    from hppctl.runtime.checkpoint import HPP_KIND, CheckpointDir, check_kind, refuse_unless_recuttable, stages_line
    from hppctl.runtime.checkpoint import plan_to_resume as checkpoint_plan
    from hppctl.runtime.session import Lineage, plan_digest, plan_document

    view = view or RunView()
    meta = CheckpointDir(checkpoint_dir).newest_meta()
    if meta is not None:
        check_kind(meta["_file"], meta, HPP_KIND)
    resumed, lineage = (plan, Lineage(origin=plan_digest(plan))) if rejoin else checkpoint_plan(meta, plan)
    if resumed is plan:
        if meta is not None and meta.get("plan") != plan_document(plan):
            refuse_unless_recuttable(meta["_file"], meta.get("plan"), plan_document(plan))  # before any worker
            view.note(f"--resume: round {meta['round']} was written by another plan of {plan.model}; its state is "
                      f"re-cut to {plan_file}'s stages")
        return plan, profile, lineage
    view.note(f"--resume: fault tolerance re-planned {plan_file} without {', '.join(lineage.lost)}; resuming on the "
              f"plan the run ended with: {stages_line(plan_document(resumed))} (--rejoin when it is back)")
    # a profile without those devices is refused by preflight, naming the digest that does not match
    if profile is not None and set(lineage.lost) <= {d.name for d in profile.devices}:
        profile = without_devices(profile, lineage.lost)
    return resumed, profile, lineage


def initial_state(init_from: Path | None, model: str, resume_dir: Path | None,
                  view: RunView | None = None) -> dict | None:
    """The weights `--init-from` gives (checked: runtime/warmstart.py), or None: not given, or a
    `--resume` that finds a round to continue, which wins (so one cron line works from its first
    day, when the checkpoint directory is still empty, and every day after)."""
    from hppctl.runtime.checkpoint import CheckpointDir

    if init_from is None:
        return None
    if resume_dir is not None:
        newest = CheckpointDir(resume_dir).newest_round_number()
        if newest:
            (view or RunView()).note(f"--init-from: not used: --resume continues from round {newest} of {resume_dir}")
            return None
    from hppctl.runtime.warmstart import load_initial_state

    return load_initial_state(init_from, model)


def recovery_options(profile, *, heartbeat: float, timeout: float, probe_timeout: float, replan: str,
                     replicate_every: int):
    """The embedded coordinator's settings (values checked by the caller), or None when re-planning
    is off or there is no profile to re-plan on (any loss ends the run)."""
    from hppctl.runtime.ft_session import RecoveryOptions

    if replan == "off" or profile is None:
        return None
    return RecoveryOptions(profile=profile, heartbeat_s=heartbeat, timeout_s=timeout, probe_s=probe_timeout,
                           replicate_every=replicate_every, replan=replan)


def model_layers(model: str, granularity: str):
    """The model's layer sequence from the zoo (built-in name or `hf:PATH`), and for `block` the fine
    layers each block is made of (None if they do not nest), so that a block is timed as its kernels."""
    from hppctl.errors import RuntimeFailure

    try:
        from hppctl.zoo import layer_costs
    except ImportError:
        raise RuntimeFailure("the model zoo (hppctl.zoo.layer_costs) is not available in this build") from None
    from hppctl.profiling.from_presets import group_layers

    layers = layer_costs(model, granularity)
    if granularity == "fine":
        return layers, None
    from hppctl.zoo import nested_fine_layers

    fine = nested_fine_layers(model)  # None: a user model traced to its blocks only
    return layers, group_layers(layers, fine) if fine is not None else None


def probe_code(user_code):
    """What `profile_cluster` needs of a run's user code (`runtime.workdir.user_code`, with a workdir):
    a `profiling.remote.ProbeCode` whose install ships the workdir with `runtime.workdir.install`
    (profiling sits below the runtime and is handed this). None without a workdir."""
    if user_code is None or user_code.workdir is None:
        return None
    from hppctl.profiling.remote import ProbeCode
    from hppctl.runtime.workdir import install

    workdir = user_code.workdir
    return ProbeCode(local_path=str(workdir.root), remote_path=workdir.remote_path,
                     install=lambda conn, python: install(conn, workdir, python),
                     modules=tuple(m.module for m in user_code.modules))


# --- parallel split learning --------------------------------------------------------------------------

def spec_profile(spec, source: str):
    """A preset profile of a PSL spec's clients and helpers at the spec's batch size."""
    from hppctl.models.psl import OPTIMIZERS
    from hppctl.profiling.from_presets import build_preset_profile
    from hppctl.profiling.presets import get_preset
    from hppctl.zoo import layer_costs

    for role, group in (("clients", spec.clients), ("helpers", spec.helpers)):
        for k, d in enumerate(group):
            get_preset(d.preset, device=d.name, source=f"{source}: {role}.{k}.preset")
    try:
        layers = layer_costs(spec.model, spec.granularity)
    except BadInput as e:
        raise BadInput(f"{source}: model: {e}") from None
    return build_preset_profile(spec.cluster_spec(), layers, model=spec.model, granularity=spec.granularity,
                                batch_sizes=[spec.batch], optimizer_state_factor=OPTIMIZERS[spec.optimizer],
                                source=source)


def train_psl(plan, cluster, options, data, *, view: RunView | None = None, metrics=None, save_model=None,
              listen=None, log=None, user_code=None, trace=None, checkpoint_dir=None, checkpoint_every: int = 1,
              resume: bool = False, announce=None, initial_state=None, expected_start=None) -> dict:
    """Run a PSL session (runtime/psl/), write metrics, the trace and the model; return the summary.
    user_code, announce, initial_state, expected_start: as `train`'s. With `checkpoint_dir`, every device's state is written
    there every `checkpoint_every` rounds and at the end; `resume` starts from the newest round there."""
    from hppctl.runtime.psl.session import PslRunRequest, PslSession, summarize as summarize_psl
    from hppctl.runtime.results import save_model as write_model
    from hppctl.store import open_output_stream, write_text_atomic

    view = view or RunView()
    rounds = options.train.rounds
    log_file = open_output_stream(log, append=True) if log else None  # appended to: a refused run adds nothing
    metrics_file = None
    session = PslSession(PslRunRequest(plan, cluster, options, listen=listen, log=log_file, trace=trace is not None,
                                       checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                                       resume=resume, initial_state=initial_state, expected_start=expected_start))
    try:
        session.lock_checkpoint()  # another run active: exit 75 before any output, --metrics untouched
        session.resume_point()  # a checkpoint it cannot resume: exit 2, likewise
        if announce:
            view.note(announce)
        if metrics is not None:
            metrics_file = open_output_stream(metrics, append=resume)

        def on_round(row: dict) -> None:
            _write_row(metrics_file, row)
            view.round_done(row, "round", rounds)

        session.user_code = user_code
        session.on_phase = lambda name: _announce_phase(view, session, name, rounds, "round")
        result = session.run(on_round=on_round, on_event=view.event)
        view.ended()
    finally:
        session.unlock_checkpoint()
        for f in (metrics_file, log_file):
            if f is not None:
                f.close()
    summary = summarize_psl(result)
    state = result.client_model(plan.clients[0])  # every client holds the same model after FedAvg
    summary["test_accuracy"] = test_pass(plan.model, state, data.test, view) if data.test is not None else None
    if save_model is not None:
        with view.phase("saving"):
            write_model(plan.model, state, save_model)
    traced = trace is not None and result.trace is not None  # (a resumed run with nothing to run traced nothing)
    if traced:
        write_text_atomic(trace, json.dumps(result.trace) + "\n")
    summary.update(saved_model=str(save_model) if save_model else None, metrics=str(metrics) if metrics else None,
                   trace=str(trace) if traced else None, checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else None)
    summary["workdir"] = shipped_workdir(user_code, view)
    return summary


# --- collaborative inference: the request's token ids and its output ----------------------------------

def read_input_ids(path: Path):
    """Token ids from a JSON list (or {"input_ids": [...]}) or a tensor saved with torch.save (.pt).
    Read like any input (store.read_input_bytes): a regular file within the size limit, so a FIFO
    does not block and a huge file is refused before it is read."""
    import io

    import torch

    from hppctl.store import read_input_bytes

    try:
        raw = read_input_bytes(path)
    except BadInput as e:
        raise BadInput(f"--input-ids: {e}") from None
    if path.suffix.lower() == ".json":
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as e:  # RecursionError: 10⁵ nested `[`
            raise BadInput(f"--input-ids: {path}: not JSON ({shorten(str(e))})") from None
        if isinstance(doc, dict):
            doc = doc.get("input_ids")
        if not isinstance(doc, list) or not all(isinstance(x, int) for x in flat_ids(doc)):
            raise BadInput(f"--input-ids: {path}: expected a JSON list of integer token ids")
        return torch.tensor(flat_ids(doc), dtype=torch.long)
    try:
        ids = torch.load(io.BytesIO(raw), weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's input error
        raise BadInput(f"--input-ids: {path}: not a saved tensor or JSON list ({e.__class__.__name__})") from None
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point():
        raise BadInput(f"--input-ids: {path}: expected an integer tensor of token ids")
    return ids.reshape(-1).long()


def flat_ids(doc: list) -> list:
    """A JSON list of ids, or a list of rows of ids, as one flat list."""
    return [x for row in doc for x in row] if doc and isinstance(doc[0], list) else doc


def text_ids(model: str, text: str, note=lambda line: None):
    """Token ids of `text`: the checkpoint's own tokenizer for `hf:PATH` when it has one; otherwise
    (built-in models have random weights and no vocabulary) the UTF-8 bytes, one id per byte."""
    import torch

    from hppctl.zoo import get_model

    spec = get_model(model)
    vocabularies = ("tokenizer.json", "vocab.json", "vocab.txt", "tokenizer.model")
    if spec.hf_path is not None and any((Path(spec.hf_path) / f).is_file() for f in vocabularies):
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(spec.hf_path, local_files_only=True)
        except (OSError, ValueError) as e:
            raise BadInput(f"--input: {model}: cannot load the checkpoint's tokenizer ({e})") from None
        return torch.tensor(tokenizer(text)["input_ids"], dtype=torch.long)
    # NOTE: without vocabulary files transformers 5 builds an EMPTY tokenizer that maps any text to no ids.
    note(f"{model}: no tokenizer files; using the UTF-8 bytes of --input as token ids")
    return torch.tensor(list(text.encode()), dtype=torch.long)


def save_tensor(path: Path, tensor) -> None:
    """torch.save, atomically (temp file + rename), never over a device or a symlink."""
    import torch

    from hppctl.store import atomic_output

    with atomic_output(path) as f:
        torch.save(tensor, f)


# --- parallel split learning: planning ---------------------------------------------------------------

def compare_psl_methods(times, request, options, simulate_psl) -> list[dict]:
    """Every PSL planning method on one instance (`hppctl psl plan --compare`): its makespans, solver
    time and bound, and the simulated makespan against random-fcfs's."""
    from hppctl.errors import Infeasible
    from hppctl.models.psl import METHODS
    from hppctl.planner.psl import plan_times

    rows = []
    for method in METHODS:
        try:
            plan = plan_times(times, request, method, **options)
        except Infeasible as e:
            rows.append({"method": method, "feasible": False, "error": str(e)})
            continue
        rows.append({"method": method, "chosen": plan.method, "feasible": True,
                     "predicted_makespan_s": plan.prediction.makespan_s,
                     "simulated_makespan_s": simulate_psl(plan).makespan_s,
                     "makespan_slots": plan.prediction.makespan_slots, "slot_s": plan.slot_s,
                     "solver_time_s": plan.solver_time_s, "lower_bound_s": plan.prediction.lower_bound_s})
    base = next((r["simulated_makespan_s"] for r in rows if r["method"] == "random-fcfs" and r["feasible"]), None)
    for r in rows:
        if r["feasible"] and base:
            r["vs_random_fcfs"] = r["simulated_makespan_s"] / base - 1
    return rows
