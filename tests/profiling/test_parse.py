"""parse.py on captured probe outputs: records, batches, device profiles, links, fingerprints, failure reasons."""

import json
import statistics

import pytest

from hppctl.models.profile import DeviceProfile
from hppctl.profiling import parse
from hppctl.profiling.records import Identity
from tests.profiling.captured import found, text


def identity(name: str = "identify-lab-h3.jsonl", **changes) -> Identity:
    record = parse.first(found(name), "identity")
    return Identity.model_validate({**record, **changes})


def test_records_skip_noise_and_partial_lines():
    noisy = 'warning: something\n{"type": "a", "x": 1}\nnot json {\n{"no_type": 1}\n{"type": "b"'
    assert parse.records(noisy) == [{"type": "a", "x": 1}]


def test_identity_of_a_lab_host_reads_the_hidden_quota_from_the_duty_cycle():
    ident = identity()
    assert ident.hostname == "h3" and ident.threads == 1
    assert ident.cpu_quota_source.startswith("measured duty cycle")
    assert 0.21 <= ident.cpu_quota_cores <= 0.30
    local = identity("identify-local.jsonl")
    assert local.cpu_quota_cores is None and local.threads == local.cpus


def test_train_output_of_tiny_cnn_becomes_one_batch_per_size():
    setup, batches, skips = parse.batches_from_output(found("train-tiny-cnn-lab-h2.jsonl"))
    assert setup.layers == 11 and setup.clock == "cpu" and setup.threads == 1 and skips == []
    assert [b.batch_size for b in batches] == [1, 4, 16]
    for b in batches:
        assert len(b.forward) == len(b.backward) == 11
        assert all(len(samples) == 5 for samples in b.forward + b.backward)
        assert b.step.count >= 5 and len(b.step.clock_s) == b.step.count  # at least one step per pass
        assert b.peak_bytes > 0 and b.optimizer_step_s


def test_device_profile_is_medians_times_the_sustained_factor():
    setup, batches, _ = parse.batches_from_output(found("train-tiny-cnn-lab-h2.jsonl"))
    ident = identity(hostname="h2")
    p = parse.device_profile("h2", ident, setup, batches, memory_bytes=None, repeats=5, warmup=1)
    assert isinstance(p, DeviceProfile) and p.source == "measured" and p.kind == "measured:h2"
    assert p.batch_sizes == [1, 4, 16]
    for k, b in enumerate(batches):
        factor = b.step.wall_s / b.step.cpu_s
        assert p.measurement.sustained_factor[k] == pytest.approx(factor)
        for layer in range(11):
            assert p.forward_s[layer][k] == pytest.approx(statistics.median(b.forward[layer]) * factor)
            assert p.backward_s[layer][k] == pytest.approx(statistics.median(b.backward[layer]) * factor)
        assert p.train_step_s[k] == pytest.approx(b.step.wall_s / b.step.count)
        assert p.train_peak_bytes[k] == b.peak_bytes
    # a 0.5-core host: every wall second holds about half a CPU second
    assert all(1.6 < f < 2.6 for f in p.measurement.sustained_factor)
    assert p.measurement.threads == 1 and p.measurement.clock == "cpu" and p.runtime_bytes == setup.runtime_bytes


def test_spread_is_the_interquartile_range_over_the_median():
    assert parse.spread([1.0]) == 0.0
    assert parse.spread([2.0, 2.0, 2.0]) == 0.0
    assert parse.spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((4.0 - 2.0) / 3.0)
    assert parse.spread([0.0, 0.0, 0.0]) == 0.0


def test_mobilenetv2_batch_one_keeps_the_batchnorm_note_and_the_layer_count():
    setup, batches, _ = parse.batches_from_output(found("train-mobilenetv2-lab-h1.jsonl"))
    assert setup.layers == 142 and [b.batch_size for b in batches] == [1, 8]
    p = parse.device_profile("h1", identity(hostname="h1"), setup, batches, memory_bytes=2 * 10**9, repeats=3,
                             warmup=1)
    assert any("BatchNorm" in n and "batch 1" in n for n in p.measurement.notes)
    assert p.memory_bytes == 2 * 10**9 and p.measurement.memory_budget_source == "inventory"
    # the layers compose into the whole step (same engine run, split by hooks): loosely, the probe's clock
    for b in batches:
        layers = sum(statistics.median(f) + statistics.median(bw) for f, bw in zip(b.forward, b.backward))
        assert 0.7 < layers / statistics.median(b.step.clock_s) < 1.4


def test_memory_budget_without_inventory_subtracts_the_worker_runtime():
    ident = identity(memory_limit_bytes=10**9, memory_limit_source="cgroup v1")
    assert parse.memory_budget(ident, 4 * 10**8, None) == (6 * 10**8, "cgroup limit minus the worker's runtime", 10**9)
    no_limit = identity(memory_limit_bytes=None, memory_available_bytes=8 * 10**9)
    assert parse.memory_budget(no_limit, 10**9, None)[0] == 7 * 10**9
    assert parse.memory_budget(no_limit, 10**9, 3 * 10**9)[:2] == (3 * 10**9, "inventory")


def test_each_forward_loses_the_cost_of_calling_its_own_stage_and_backward_keeps_its_time():
    setup, batches, _ = parse.batches_from_output(found("train-tiny-cnn-lab-h2.jsonl"))
    ident = identity(hostname="h2")

    def profile(stage_call_s: float):
        return parse.device_profile("h2", ident, setup.model_copy(update={"stage_call_s": stage_call_s}), batches,
                                    memory_bytes=None, repeats=5, warmup=1)

    raw, calibrated = profile(0.0), profile(20e-6)
    assert calibrated.measurement.stage_call_s == 20e-6 and raw.measurement.stage_call_s == 0.0
    assert calibrated.backward_s == raw.backward_s
    factors = raw.measurement.sustained_factor
    for layer_raw, layer_calibrated in zip(raw.forward_s, calibrated.forward_s):
        for t, c, f in zip(layer_raw, layer_calibrated, factors):
            assert c == pytest.approx(max(t - 20e-6 * f, 0.1 * t))
    assert sum(map(sum, calibrated.forward_s)) < sum(map(sum, raw.forward_s))
    # a call cost larger than a layer (measured on a busy machine) leaves a tenth of it, never nothing
    assert parse.without_stage_call(5e-6, 20e-6) == pytest.approx(5e-7)


def test_a_batch_from_another_layer_count_is_refused():
    setup, batches, _ = parse.batches_from_output(found("train-tiny-cnn-lab-h2.jsonl"))
    _, memories, passes, _ = parse.train_output(found("train-tiny-cnn-lab-h2.jsonl"))
    wrong = setup.model_copy(update={"layers": 12})
    with pytest.raises(parse.ProbeOutputError, match="12"):
        parse.assemble_batch(wrong, memories[0], [p for p in passes if p.batch_size == 1])
    with pytest.raises(parse.ProbeOutputError, match="no timed pass"):
        parse.assemble_batch(setup, memories[0], [])


def test_a_malformed_record_names_its_type_and_field():
    record = parse.first(found("train-tiny-cnn-lab-h2.jsonl"), "setup")
    with pytest.raises(parse.ProbeOutputError, match="'setup'.*layers"):
        parse.typed({**record, "layers": "many"}, parse.Setup)


def test_fingerprint_ignores_a_measured_quota_but_not_an_exact_one_nor_the_host_key():
    base = identity()
    assert parse.fingerprint(base) == parse.fingerprint(identity(cpu_quota_cores=0.12))  # a busy machine
    assert parse.fingerprint(base) != parse.fingerprint(identity(threads=2))
    assert parse.fingerprint(base) != parse.fingerprint(identity(hostname="h2"))
    assert parse.fingerprint(base) != parse.fingerprint(identity(torch="2.0.0"))
    assert parse.fingerprint(base, "key-a") != parse.fingerprint(base, "key-b")  # a lab built again
    exact = identity(cpu_quota_cores=0.25, cpu_quota_source="cgroup v2")
    assert parse.fingerprint(exact) != parse.fingerprint(identity(cpu_quota_cores=0.5, cpu_quota_source="cgroup v2"))


def test_link_from_captured_transfer_and_ping():
    recv = parse.received(found("recv-lab-h1-to-h2.jsonl"))
    ping = parse.pinged(found("ping-lab-h1-to-h2.jsonl"))
    slower = recv.model_copy(update={"bytes_per_s": recv.bytes_per_s * 0.9})
    link = parse.link_profile("h1", "h2", recv, slower, ping)
    assert link.between == ["h1", "h2"] and link.source == "measured"
    assert link.directed_bytes_per_s == [recv.bytes_per_s, slower.bytes_per_s]
    assert link.bytes_per_s == slower.bytes_per_s  # the slower direction
    assert link.rtt_s == pytest.approx(statistics.median(ping.rtt_s))
    assert 0.9 * 12.5e6 < recv.bytes_per_s < 12.5e6  # a 100 Mbit/s lab link, TCP goodput


def test_a_link_without_bytes_is_an_error():
    recv = parse.received(found("recv-lab-h1-to-h2.jsonl")).model_copy(update={"bytes_per_s": 0.0, "bytes": 0})
    with pytest.raises(parse.ProbeOutputError, match="no bytes"):
        parse.link_profile("a", "b", recv, recv, None)
    with pytest.raises(parse.ProbeOutputError, match="printed no result"):
        parse.received([])


@pytest.mark.parametrize("text, version", [("hppctl 0.1.0\n", "0.1.0"), ("Python 3.11\n", None), ("", None),
                                           ("warning: x\nhppctl 2.0\n", "2.0")])
def test_parse_version(text, version):
    assert parse.parse_version(text) == version


def test_exit_reasons():
    killed = found("train-killed-lab-h1.jsonl")
    reason = parse.exit_reason("train", -1, "", killed, memory_limit=10**9)
    assert "killed at batch 1024 (memory)" in reason and "out of memory" in reason and "1000 MB" in reason
    assert parse.exit_reason("train", 137, "", killed).startswith("probe 'train' was killed at batch 1024")
    error = parse.exit_reason("train", 1, "", found("train-error.jsonl"))
    assert "no-such-model" in error
    assert "not installed" in parse.exit_reason("identify", 1, "/usr/bin/python3: No module named hppctl\n", [])
    assert parse.exit_reason("identify", 127, "bash: python9: command not found\n", []).startswith("command not found")
    assert parse.exit_reason("x", 3, "Traceback...\nValueError: bad\n", []) == "probe 'x' exited with 3: ValueError: bad"


def test_captured_files_are_json_lines():
    for name in ("train-tiny-cnn-lab-h2.jsonl", "identify-local.jsonl", "ping-lab-h1-to-h2.jsonl"):
        assert all(json.loads(line) for line in text(name).splitlines())


def with_weight_grad(records: list[dict], share: float = 0.4, lacking: int | None = None) -> list[dict]:
    """The captured records as this probe prints them: every pass with a weight-gradient part of its
    backward (`share` of it), except pass number `lacking` (as an older probe's)."""
    changed, passes = [], 0
    for r in records:
        if r["type"] == "pass":
            if passes != lacking:
                r = {**r, "weight_grad": [share * b for b in r["backward"]]}
            passes += 1
        changed.append(r)
    return changed


def test_weight_gradient_times_are_medians_times_the_sustained_factor_as_the_backward():
    setup, batches, _ = parse.batches_from_output(with_weight_grad(found("train-tiny-cnn-lab-h2.jsonl")))
    p = parse.device_profile("h2", identity(hostname="h2"), setup, batches, memory_bytes=None, repeats=5, warmup=1)
    for k, b in enumerate(batches):
        factor = p.measurement.sustained_factor[k]
        for layer in range(11):
            assert b.weight_grad[layer] == [0.4 * s for s in b.backward[layer]]
            assert p.weight_grad_s[layer][k] == pytest.approx(statistics.median(b.weight_grad[layer]) * factor)
            assert p.weight_grad_s[layer][k] == pytest.approx(0.4 * p.backward_s[layer][k])
    assert DeviceProfile.model_validate_json(p.model_dump_json()).weight_grad_s == p.weight_grad_s


def test_passes_of_an_older_probe_give_no_weight_gradient_times():
    # the captured outputs predate PROBE_VERSION 5: they still load, and the profile does not pretend to split
    for records in (found("train-tiny-cnn-lab-h2.jsonl"), with_weight_grad(found("train-tiny-cnn-lab-h2.jsonl"), lacking=3)):
        setup, batches, _ = parse.batches_from_output(records)
        p = parse.device_profile("h2", identity(hostname="h2"), setup, batches, memory_bytes=None, repeats=5, warmup=1)
        assert p.weight_grad_s is None and "weight_grad_s" not in p.model_dump(exclude_none=True)
        assert len(p.backward_s) == 11


def test_a_pass_whose_weight_gradients_miss_a_layer_is_refused():
    records = with_weight_grad(found("train-tiny-cnn-lab-h2.jsonl"))
    bad = next(r for r in records if r["type"] == "pass")
    bad["weight_grad"] = bad["weight_grad"][:-1]
    with pytest.raises(parse.ProbeOutputError, match="10/11 layers"):
        parse.batches_from_output(records)
