"""Checker rules of asynchronous schedules (`nf1b`, `pipedream`; `Schedule.micro_batches_per_update` set). PURE.

`check.check_schedule` runs these after its own rules 1–5 and 7 (rule 6, one STEP at the end,
is replaced by A2 here). Each problem names the device, the action and the rule:

A1. one device per stage;
A2. mini-batch k is micro-batches kN … kN+N−1; on every device each micro-batch's backward comes
    after its forward, mini-batches are backwarded in order, and exactly one STEP follows the N
    backwards of each mini-batch before any backward of the next; the last action is a STEP;
A3. every F and B carries a weight version; the head's forward runs with its current version (its
    STEPs so far), every other stage forwards with the head's version of that micro-batch (vertical
    sync), and no action uses a version the device has not produced yet;
A4. backwards: `nf1b` with the device's latest version (no horizontal stash), `pipedream` with the
    version of the micro-batch's forward (weight stashing);
A5. the head never has more than `in_flight_cap` mini-batches started and not yet stepped.

`versions_held` gives, per device, the most weight versions it must keep at once: a version lives
from its STEP until its last use (the latest always lives). That is the weight-stash memory the
two policies differ by.
"""

from __future__ import annotations

from typing import Callable

from hppctl.models.schedule import Action, Schedule

Report = Callable[[str, int | None, Action | None, str], None]
"""`check._Problems.add`: (device, action index, action, message)."""


def check_async(schedule: Schedule, report: Report) -> None:
    N = schedule.micro_batches_per_update
    if N is None:
        tagged = [(d, i, a) for d, actions in schedule.actions.items() for i, a in enumerate(actions) if a.version is not None]
        if tagged:
            report(*tagged[0], "a synchronous round has one weight version: F and B take no version tag")
        return
    crowded = [s for s in schedule.stages if len(s.devices) != 1]
    if crowded:
        report(crowded[0].devices[0], None, None, f"asynchronous schedule {schedule.policy!r} needs one device per "
                                                  f"stage; a stage has {len(crowded[0].devices)}")
        return
    if schedule.num_micro_batches % N:
        report(schedule.stages[0].devices[0], None, None, f"{schedule.num_micro_batches} micro-batches are not "
                                                          f"whole mini-batches of {N}")
        return
    head = schedule.stages[0].devices[0]
    f_version = {a.micro_batch: a.version for a in schedule.actions[head] if a.kind == "F"}
    for p, stage in enumerate(schedule.stages):
        device = stage.devices[0]
        _check_device(schedule, device, p == 0, f_version, report)
    _check_cap(schedule, head, report)


def _check_device(schedule: Schedule, device: str, is_head: bool, f_version: dict, report: Report) -> None:
    N, policy = schedule.micro_batches_per_update, schedule.policy
    actions = schedule.actions[device]
    steps, backwarded, forwarded = 0, 0, {}
    for i, a in enumerate(actions):
        if a.kind == "STEP":
            if backwarded != (steps + 1) * N:
                report(device, i, a, f"STEP {steps} must follow the {N} backwards of mini-batch {steps} "
                                     f"({backwarded - steps * N} done)")
                return
            steps += 1
            continue
        if a.kind not in ("F", "B"):
            continue
        if a.version is None:
            report(device, i, a, "an asynchronous schedule tags every F and B with its weight version (e.g. @2)")
            return
        if a.version > steps:
            report(device, i, a, f"uses weight version {a.version}, but {device} has made only {steps} STEPs")
        if a.kind == "F":
            forwarded[a.micro_batch] = a.version
            want = steps if is_head else f_version.get(a.micro_batch)
            if a.version != want:
                why = "the head's current one" if is_head else "the head's version of this micro-batch: vertical sync"
                report(device, i, a, f"forward must run with version {want} ({why})")
            continue
        if a.micro_batch != backwarded:
            report(device, i, a, f"backwards run mini-batch after mini-batch; expected micro-batch {backwarded} here")
            return
        if a.micro_batch // N != steps:
            report(device, i, a, f"backward of mini-batch {a.micro_batch // N} before STEP {steps}")
            return
        backwarded += 1
        want = forwarded.get(a.micro_batch) if policy == "pipedream" else steps
        if a.version != want:
            why = "its forward's: weight stashing" if policy == "pipedream" else "the latest: no stash"
            report(device, i, a, f"{policy} backward must run with version {want} ({why})")
    if not actions or actions[-1].kind != "STEP" or steps != schedule.num_micro_batches // N:
        report(device, None, None, f"needs one STEP per mini-batch ({schedule.num_micro_batches // N}), the last "
                                   f"action a STEP; found {steps}")


def _check_cap(schedule: Schedule, head: str, report: Report) -> None:
    N, cap = schedule.micro_batches_per_update, schedule.in_flight_cap
    if cap is None:
        return
    started, stepped = 0, 0
    for i, a in enumerate(schedule.actions[head]):
        if a.kind == "F" and a.micro_batch % N == 0:
            started += 1
            if started - stepped > cap:
                report(head, i, a, f"{started - stepped} mini-batches in flight, the cap is {cap}")
                return
        stepped += a.kind == "STEP"


def versions_held(schedule: Schedule) -> dict[str, int]:
    """Per device, the most weight versions alive at once (1: only the latest, no stash)."""
    out = {}
    for stage in schedule.stages:
        for device in stage.devices:
            actions = schedule.actions[device]
            last_use: dict[int, int] = {}
            for i, a in enumerate(actions):
                if a.version is not None:
                    last_use[a.version] = i
            steps, peak = 0, 1
            for i, a in enumerate(actions):
                steps += a.kind == "STEP"
                older = sum(1 for v, last in last_use.items() if v < steps and last > i)
                peak = max(peak, 1 + older)
            out[device] = peak
    return out
