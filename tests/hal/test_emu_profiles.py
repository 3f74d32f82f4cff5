"""Profiles from the drivers themselves: sync, task and emu, for MobileNetV2 and for a
multi-queue program, in both formats; IREE's `iree-profile-render` reads the JSONL;
`tinyhal-run --device_profiling_*` and `--emu_summary`; calibration on MobileNetV2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_profile_format import check_chrome_trace, render, render_stats

import tinyhal
from tinyhal import errors, hal

pytestmark = pytest.mark.timeout(300)

NOOP = ("static int k(const tinyhal_environment_t* e, const tinyhal_dispatch_state_t* d,"
        " const tinyhal_workgroup_state_t* w) { return 0; }")


@pytest.fixture(scope="module")
def mobilenet():
    pytest.importorskip("onnx")
    from support.models import mobilenet_input, mobilenet_v2_vmfb

    return mobilenet_v2_vmfb(), mobilenet_input()


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def device_for(driver: str, **options):
    if driver == "emu":
        options.setdefault("preset", "edge-npu")
    return hal.create_device(driver, **options)


@pytest.mark.parametrize("driver", ["sync", "task", "emu"])
def test_mobilenet_profile_from_the_driver_in_both_formats(driver, mobilenet, tmp_path):
    vmfb, x = mobilenet
    device = device_for(driver)
    with tinyhal.load(vmfb, device=device) as module:
        module.mobilenet_v2(x)
        with device.profiling() as profile:
            module.mobilenet_v2(x)
    device.close()
    jsonl, chrome = tmp_path / "mn.jsonl", tmp_path / "mn.json"
    profile.write(jsonl)
    profile.write(chrome)
    check_chrome_trace(json.loads(chrome.read_text()))
    recs = records(jsonl)
    host = [r for r in recs if r["record_type"] == "host_execution_event" and r["op"] == "dispatch"]
    assert len(host) == 55 and all(r["key"].startswith("mobilenet_v2") for r in host)
    assert all(min(r["workgroup_count"]) >= 1 for r in host)
    # each tied to its queue submission (the renderer draws a flow arrow per tie)
    submissions = {r["submission_id"] for r in recs if r["record_type"] == "queue_event"}
    assert all(r["submission_id"] in submissions for r in host)
    assert any(r["record_type"] == "event_relationship" for r in recs)
    if driver == "emu":  # device time too, tied to host time by clock correlation
        device_spans = [r for r in recs if r["record_type"] == "dispatch_event"]
        assert len(device_spans) == 55
        assert any(r["record_type"] == "clock_correlation" for r in recs)
        assert all(r["end_tick"] >= r["start_tick"] for r in device_spans)
    _pftrace, log = render(jsonl)
    assert render_stats(log)["host_execution_slices"] >= 55


@pytest.mark.parametrize("driver", ["sync", "task", "emu"])
def test_multi_queue_program_profile(driver, tmp_path):
    """Independent streams of work (two queues on emu; one queue elsewhere) profiled:
    queue ids carried into both formats, and on emu the two queues overlap."""
    library = hal.build_executable(NOOP, ["k"], name="profile_multiqueue")
    queues = 2 if driver == "emu" else 1
    options = dict(queues=2, dma_engines=2, compute_units=4) if driver == "emu" else {}
    device = device_for(driver, **options)
    exe = device.load_executable(library)
    bufs = [device.allocator.allocate(1 << 16) for _ in range(2)]
    with device.profiling() as profile:
        sems = []
        for i in range(4):
            q = i % queues
            cb = device.create_command_buffer()
            cb.fill(bufs[i % 2], 0, 1 << 16, i)
            cb.dispatch(exe, "k", (2, 1, 1))
            cb.finalize()
            sem = device.create_semaphore()
            device.submit(cb, signal=[(sem, 1)], queue=q)
            sems.append(sem)
        for sem in sems:
            sem.wait(1, timeout=30)
    device.close()
    assert profile.queue_count == queues
    jsonl, chrome = tmp_path / "mq.jsonl", tmp_path / "mq.json"
    profile.write(jsonl)
    profile.write(chrome)
    check_chrome_trace(json.loads(chrome.read_text()))
    recs = records(jsonl)
    submitted = [r for r in recs if r["record_type"] == "queue_event"]
    assert sorted({r["queue_ordinal"] for r in submitted}) == list(range(queues))
    spans = [r for r in recs if r["record_type"] == "host_execution_event" and r["op"] == "dispatch"]
    assert len(spans) == 4
    if driver == "emu":
        device_spans = [r for r in recs if r["record_type"] == "dispatch_event"]
        by_queue = {}
        for r in device_spans:
            by_queue.setdefault(r["queue_ordinal"], []).append((r["start_tick"], r["end_tick"]))
        assert any(a0 < b1 and b0 < a1 for a0, a1 in by_queue[0] for b0, b1 in by_queue[1])
    _pftrace, log = render(jsonl)
    assert render_stats(log)["host_execution_slices"] >= 4


def test_profiling_context_is_exclusive_and_off_costs_an_attribute():
    with hal.create_device("sync") as device:
        assert device.profile is None
        with device.profiling("queue-events") as profile:
            assert device.profile is profile
            with pytest.raises(errors.FailedPreconditionError, match="already"):
                with device.profiling():
                    pass
        assert device.profile is None and not profile.recording
        with pytest.raises(errors.InvalidArgumentError, match="unknown device profiling mode"):
            with device.profiling("bogus"):
                pass


def test_tinyhal_run_profiles_and_prints_the_emu_summary(mobilenet, tmp_path):
    vmfb, x = mobilenet
    np.save(tmp_path / "x.npy", x)
    for name in ("run.jsonl", "run.json"):
        result = subprocess.run(
            [sys.executable, "-m", "tinyhal.vm.run", f"--module={vmfb}", "--device=emu://edge-npu",
             f"--input=@{tmp_path / 'x.npy'}", "--output_max_element_count=4",
             "--device_profiling_mode=queue-events,host-execution,dispatch-events,memory-events",
             f"--device_profiling_output={tmp_path / name}", "--emu_summary"],
            capture_output=True, text=True, timeout=240)
        assert result.returncode == 0, result.stderr
        assert "emu (edge-npu): modelled" in result.stderr and "compute" in result.stderr
    assert any(r["record_type"] == "dispatch_event" for r in records(tmp_path / "run.jsonl"))
    check_chrome_trace(json.loads((tmp_path / "run.json").read_text()))
    bad = subprocess.run([sys.executable, "-m", "tinyhal.vm.run", f"--module={vmfb}",
                          f"--input=@{tmp_path / 'x.npy'}",
                          f"--device_profiling_output={tmp_path / 'run.ireeprof'}"],
                         capture_output=True, text=True, timeout=240)
    assert bad.returncode == 1 and "extension picks the format" in bad.stderr


def test_calibration_on_mobilenet_reports_per_dispatch_error(mobilenet):
    """Fit per-export costs on one invocation, predict a second one's dispatches."""
    vmfb, x = mobilenet
    emu = hal.create_device("emu", preset="edge-npu", calibrate=True)
    with tinyhal.load(vmfb, device=emu) as module:
        expected = module.mobilenet_v2(x)
        fit_on = emu.calibration_samples()
        assert len(fit_on) == 55
        emu.fit_calibration(fit_on)
        again = module.mobilenet_v2(x)
        assert again.tobytes() == expected.tobytes()
        held_out = emu.calibration_samples()[len(fit_on):]
        report = emu.calibration_report(held_out)
    emu.close()
    assert len(report.rows) == 55
    assert all(np.isfinite(r[4]) for r in report.rows)
    assert 0.0 <= report.median_abs_error <= report.max_abs_error
    print(report.format())
    assert emu.summary().calibration_error == report.mean_abs_error


def test_accelerator_costs_in_the_profile(mobilenet, tmp_path):
    """With an accelerator, each modelled dispatch span carries what its cost model said
    (compute and stall cycles, DRAM bytes read and written, work source), in both
    formats; the span lasts its cycles at the clock and IREE's renderer still reads it."""
    vmfb, x = mobilenet
    emu = hal.create_device("emu", accelerator={"rows": 128, "cols": 128, "dataflow": "ws",
                                                "ifmap_bandwidth": 10.0,
                                                "filter_bandwidth": 10.0,
                                                "ofmap_bandwidth": 10.0})
    with tinyhal.load(vmfb, device=emu) as module:
        module.mobilenet_v2(x)
        with emu.profiling() as profile:
            module.mobilenet_v2(x)
    summary = emu.summary()
    emu.close()
    jsonl, chrome = tmp_path / "mn.jsonl", tmp_path / "mn.json"
    profile.write(jsonl)
    profile.write(chrome)
    spans = [r for r in records(jsonl) if r["record_type"] == "dispatch_event"]
    assert len(spans) == 55
    for r in spans:
        cycles = r["tinyhal_compute_cycles"] + r["tinyhal_stall_cycles"]
        assert r["end_tick"] - r["start_tick"] == cycles  # 1 GHz: a tick is a cycle
        assert r["tinyhal_work_source"] in ("export-name", "compiler", "workgroups")
        if r["tinyhal_work_source"] != "workgroups":  # priced by its work: reads and writes
            assert r["tinyhal_dram_read_bytes"] > 0 and r["tinyhal_dram_write_bytes"] > 0
        else:  # priced by its workgroups (a copy): its bound bytes, not told apart
            assert r["tinyhal_dram_read_bytes"] > 0 == r["tinyhal_dram_write_bytes"]
        assert 0.0 <= r["tinyhal_utilisation"] <= 1.0
    assert any(r["tinyhal_stall_cycles"] for r in spans)
    # the profiled run's totals are the summary's second half (two runs, same costs)
    moved = sum(r["tinyhal_dram_read_bytes"] + r["tinyhal_dram_write_bytes"] for r in spans)
    assert 2 * moved == sum(d.dram_bytes * d.count for d in summary.dispatch_costs)
    device_events = [e for e in json.loads(chrome.read_text())["traceEvents"]
                     if e.get("cat") == "dispatch" and "start_tick" in e["args"]]
    assert len(device_events) == 55
    assert all("stall_cycles" in e["args"] for e in device_events)
    _pftrace, log = render(jsonl)
    assert render_stats(log)["host_execution_slices"] >= 55
    draw_profile_timeline(jsonl, spans, tmp_path / "mn.png")


def draw_profile_timeline(jsonl: Path, spans: list[dict], png: Path) -> None:
    """bench/emu_timeline.py reads the profile back: each dispatch split into compute and
    stall time as its cycles split, its DRAM bytes as GB/s over its span; it draws them."""
    import importlib.util

    script = Path(__file__).resolve().parents[2] / "bench" / "emu_timeline.py"
    spec = importlib.util.spec_from_file_location("emu_timeline", script)
    timeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timeline)
    events, title = timeline.profile_events(str(jsonl))
    dispatches = [e for e in events if e["engine"] == "compute"]
    assert len(dispatches) == len(spans)
    for event, span in zip(dispatches, spans):
        compute, stall = timeline.dispatch_segments(event)
        assert compute + stall == event["duration_ns"]
        assert stall * (span["tinyhal_compute_cycles"] + span["tinyhal_stall_cycles"]) == \
            pytest.approx(event["duration_ns"] * span["tinyhal_stall_cycles"])
        read, write = timeline.dram_rates(event)
        assert read * max(event["duration_ns"], 1) == pytest.approx(span["tinyhal_dram_read_bytes"])
        assert write >= 0
    pytest.importorskip("matplotlib")
    timeline.plot(events, title, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
