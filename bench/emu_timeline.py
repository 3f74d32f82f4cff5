"""Draws the emulated accelerator's timeline (queues and engines, modelled time) to PNG.

    python bench/emu_timeline.py --preset edge-npu --output emu-timeline.png
    python bench/emu_timeline.py --accelerator array.cfg --output emu-array.png
    python bench/emu_timeline.py --trace trace.json --output t.png   # from export_trace()
    python bench/emu_timeline.py --profile run.jsonl --output p.png  # an ireeperf profile

Runs MobileNetV2 (tests/support/models.py) on `emu` with the preset (or with the
accelerator of a SCALE-Sim .cfg file) unless `--trace` names a trace written by
`EmuDevice.export_trace` or `--profile` an ireeperf-jsonl profile of an emu device. One
lane per queue (its submissions' operations) and per engine (each DMA engine, the compute
engine); a dispatch's bar is as tall as the share of compute units it occupies. When the
dispatches carry modelled cycles (an accelerator, or a profile of one), each compute bar
is split into its compute and its stall time, and a second panel draws the DRAM traffic:
per dispatch, the bytes it reads and writes over its span, as GB/s at the model's clock.
Needs matplotlib, the `plot` extra
(`pip install '.[plot]'` in the checkout); without it the script says so in one line and
exits 2 before running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

COLORS = {"dispatch": "#3b7dd8", "fill": "#e0803a", "copy": "#d94f4f", "update": "#8c5cc4"}
STALL_COLOR = "#c9c9c9"
READ_COLOR, WRITE_COLOR = "#2a9d8f", "#e76f51"


def mobilenet_events(preset: str, queues: int, accelerator: str = "") -> tuple[list[dict], str]:
    import tinyhal
    from support.models import mobilenet_input, mobilenet_v2_vmfb
    from tinyhal import hal

    options = {"accelerator": accelerator} if accelerator else {"preset": preset}
    device = hal.create_device("emu", queues=queues, **options)
    with tinyhal.load(mobilenet_v2_vmfb(), device=device) as module:
        module.mobilenet_v2(mobilenet_input())  # warm: weights resident, pipelines built
        start = device.clock_ns
        first = len(device.trace())
        module.mobilenet_v2(mobilenet_input())
        events = []
        for e in device.trace()[first:]:
            event = dict(name=e.name, engine=e.engine, queue=e.queue,
                         start_ns=e.start_ns - start, duration_ns=e.duration_ns,
                         units=e.units, size=e.size)
            if accelerator and e.cost is not None:
                event.update(work_source=e.work_source,
                             compute_cycles=e.cost.compute_cycles,
                             stall_cycles=e.cost.stall_cycles,
                             dram_read_bytes=e.cost.dram_read_bytes,
                             dram_write_bytes=e.cost.dram_write_bytes)
            events.append(event)
        units = device.model.compute_units
        summary = device.summary()
    device.close()
    util = ", ".join(f"{k} {v:.0%}" for k, v in summary.utilisation.items()
                     if not k.startswith("queue"))
    for e in events:
        e["unit_share"] = e["units"] / units if e["engine"] == "compute" else 1.0
    where = (f"a {os.path.basename(accelerator)} array" if accelerator
             else f"emu '{preset}'")
    return events, f"MobileNetV2 on {where}: busy {util}"


def profile_events(path: str) -> tuple[list[dict], str]:
    """The device-time spans of an ireeperf-jsonl profile of an emu device: dispatches
    (with the cost fields emu writes beside them) and transfers, on their engines."""
    events = []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            kind = rec.get("record_type")
            if kind not in ("dispatch_event", "queue_device_event"):
                continue
            event = dict(name=rec.get("key") or rec.get("op", "dispatch"),
                         engine="compute" if kind == "dispatch_event"
                         else rec.get("tinyhal_worker") or "dma",
                         queue=rec["queue_ordinal"], start_ns=rec["start_tick"],
                         duration_ns=rec["end_tick"] - rec["start_tick"], unit_share=1.0,
                         size=rec.get("payload_length", 0))
            if kind == "queue_device_event":
                event["name"] = rec["op"]
            for field in ("compute_cycles", "stall_cycles", "dram_read_bytes",
                          "dram_write_bytes", "work_source"):
                if f"tinyhal_{field}" in rec:
                    event[field] = rec[f"tinyhal_{field}"]
            events.append(event)
    begin = min((e["start_ns"] for e in events), default=0)
    for e in events:
        e["start_ns"] -= begin
    return events, os.path.basename(path)


def dispatch_segments(event: dict) -> tuple[float, float]:
    """(compute ns, stall ns) of a dispatch's span: its duration split as its modelled
    compute and stall cycles split it (all compute when it carries no cycles)."""
    duration = event["duration_ns"]
    cycles = event.get("compute_cycles", 0) + event.get("stall_cycles", 0)
    if not cycles:
        return float(duration), 0.0
    stall = duration * event.get("stall_cycles", 0) / cycles
    return duration - stall, stall


def dram_rates(event: dict) -> tuple[float, float]:
    """(read, write) GB/s of a dispatch over its span (bytes per ns are GB/s)."""
    duration = max(event["duration_ns"], 1)
    return (event.get("dram_read_bytes", 0) / duration,
            event.get("dram_write_bytes", 0) / duration)


def trace_events(path: str) -> tuple[list[dict], str]:
    with open(path) as f:
        trace = json.load(f)
    events = []
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e["args"].get("engine") != e.get("cat"):
            continue
        seen = (e["ts"], e["name"], e["args"]["queue"])
        if any((x["start_ns"] / 1000, x["name"], x["queue"]) == seen for x in events[-4:]):
            continue
        events.append(dict(name=e["name"], engine=e["cat"], queue=e["args"]["queue"],
                           start_ns=e["ts"] * 1000, duration_ns=e["dur"] * 1000,
                           unit_share=1.0, size=e["args"].get("size", 0)))
    return events, os.path.basename(path)


def plot(events: list[dict], title: str, output: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    queues = sorted({e["queue"] for e in events})
    engines = sorted({e["engine"] for e in events}, key=lambda n: (n == "compute", n))
    lanes = [f"queue {q}" for q in queues] + engines
    row = {name: i for i, name in enumerate(reversed(lanes))}
    costed = any("compute_cycles" in e for e in events)
    height = 1.0 + 0.55 * len(lanes)
    if costed:
        fig, (ax, traffic) = plt.subplots(
            2, 1, figsize=(10, height + 2.2), dpi=100, sharex=True,
            gridspec_kw={"height_ratios": [height, 2.2]})
    else:
        fig, ax = plt.subplots(figsize=(10, height), dpi=100)
    unit = 1e6  # ms
    for e in events:
        kind = "dispatch" if e["engine"] == "compute" else e["name"]
        color = COLORS.get(kind, "#777777")
        start, width = e["start_ns"] / unit, max(e["duration_ns"] / unit, 1e-4)
        y = row[e["engine"]]
        bar = 0.8 * e.get("unit_share", 1.0)
        if e["engine"] == "compute":
            compute, stall = dispatch_segments(e)
            ax.broken_barh([(start, max(compute / unit, 1e-4))], (y - 0.4, bar),
                           facecolors=color, edgecolors="white", linewidth=0.3)
            if stall:
                ax.broken_barh([(start + compute / unit, stall / unit)], (y - 0.4, bar),
                               facecolors=STALL_COLOR, edgecolors="white", linewidth=0.3)
        else:
            ax.broken_barh([(start, width)], (y - 0.4, bar), facecolors=color,
                           edgecolors="white", linewidth=0.3)
        ax.broken_barh([(start, width)], (row[f"queue {e['queue']}"] - 0.4, 0.8),
                       facecolors=color, edgecolors="white", linewidth=0.3, alpha=0.55)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(list(reversed(lanes)))
    end = max((e["start_ns"] + e["duration_ns"] for e in events), default=0) / unit
    ax.set_xlim(0, end * 1.01 or 1)
    ax.set_title(title, fontsize=10)
    labels = list(COLORS) + (["stall (waiting for DRAM)"] if costed else [])
    colors = list(COLORS.values()) + ([STALL_COLOR] if costed else [])
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors]
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8,
              title="operation", title_fontsize=8, frameon=False)
    ax.text(1.005, 0.0, "compute bar height:\nshare of units used", transform=ax.transAxes,
            fontsize=7, va="bottom", color="#555555")
    ax.grid(axis="x", alpha=0.3)
    if costed:
        for e in events:
            if e["engine"] != "compute":
                continue
            read, write = dram_rates(e)
            span = (e["start_ns"] / unit, max(e["duration_ns"] / unit, 1e-4))
            traffic.broken_barh([span], (0, read), facecolors=READ_COLOR)
            traffic.broken_barh([span], (read, write), facecolors=WRITE_COLOR)
        # the axis fits the dispatches priced from their work: one priced by its
        # workgroups only counts its bound bytes, over a time that says nothing of them
        peak = max((sum(dram_rates(e)) for e in events if e["engine"] == "compute"
                    and e.get("work_source") != "workgroups"), default=0.0)
        traffic.set_ylim(0, peak * 1.1 or 1)
        traffic.set_ylabel("DRAM GB/s")
        traffic.legend([plt.Rectangle((0, 0), 1, 1, color=c) for c in (READ_COLOR, WRITE_COLOR)],
                       ["read", "written"], loc="upper left", bbox_to_anchor=(1.005, 1.0),
                       fontsize=8, frameon=False)
        traffic.grid(axis="x", alpha=0.3)
        traffic.set_xlabel("modelled time (ms)")
    else:
        ax.set_xlabel("modelled time (ms)")
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="edge-npu")
    parser.add_argument("--queues", type=int, default=1)
    parser.add_argument("--accelerator", default="",
                        help="a SCALE-Sim .cfg file: model MobileNetV2 on that array")
    parser.add_argument("--trace", default="", help="an EmuDevice.export_trace JSON file")
    parser.add_argument("--profile", default="",
                        help="an ireeperf-jsonl profile (.jsonl) of an emu device")
    parser.add_argument("--output", default="emu-timeline.png")
    args = parser.parse_args()
    try:
        import matplotlib  # noqa: F401  (checked before the model runs)
    except ImportError:
        print("emu_timeline.py: drawing needs matplotlib, the `plot` extra: pip install "
              "'.[plot]' (in the checkout) or pip install matplotlib", file=sys.stderr)
        sys.exit(2)
    if args.profile:
        events, title = profile_events(args.profile)
    elif args.trace:
        events, title = trace_events(args.trace)
    else:
        events, title = mobilenet_events(args.preset, args.queues, args.accelerator)
    plot(events, title, args.output)
    print(f"wrote {args.output} ({len(events)} operations)")


if __name__ == "__main__":
    main()
