"""Draws the emulated accelerator's timeline (queues and engines, modelled time) to PNG.

    python bench/emu_timeline.py --preset edge-npu --output emu-timeline.png
    python bench/emu_timeline.py --trace trace.json --output t.png   # from export_trace()

Runs MobileNetV2 (tests/support/models.py) on `emu` with the preset unless `--trace`
names a trace written by `EmuDevice.export_trace`. One lane per queue (its submissions'
operations) and per engine (each DMA engine, the compute engine); a dispatch's bar is as
tall as the share of compute units it occupies. Needs matplotlib, the `plot` extra
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


def mobilenet_events(preset: str, queues: int) -> tuple[list[dict], str]:
    import tinyhal
    from support.models import mobilenet_input, mobilenet_v2_vmfb
    from tinyhal import hal

    device = hal.create_device("emu", preset=preset, queues=queues)
    with tinyhal.load(mobilenet_v2_vmfb(), device=device) as module:
        module.mobilenet_v2(mobilenet_input())  # warm: weights resident, pipelines built
        start = device.clock_ns
        first = len(device.trace())
        module.mobilenet_v2(mobilenet_input())
        events = [dict(name=e.name, engine=e.engine, queue=e.queue, start_ns=e.start_ns - start,
                       duration_ns=e.duration_ns, units=e.units, size=e.size)
                  for e in device.trace()[first:]]
        units = device.model.compute_units
        summary = device.summary()
    device.close()
    util = ", ".join(f"{k} {v:.0%}" for k, v in summary.utilisation.items()
                     if not k.startswith("queue"))
    for e in events:
        e["unit_share"] = e["units"] / units if e["engine"] == "compute" else 1.0
    return events, f"MobileNetV2 on emu '{preset}': busy {util}"


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
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.55 * len(lanes)), dpi=100)
    unit = 1e6  # ms
    for e in events:
        kind = "dispatch" if e["engine"] == "compute" else e["name"]
        color = COLORS.get(kind, "#777777")
        start, width = e["start_ns"] / unit, max(e["duration_ns"] / unit, 1e-4)
        y = row[e["engine"]]
        height = 0.8 * e.get("unit_share", 1.0)
        ax.broken_barh([(start, width)], (y - 0.4, height), facecolors=color,
                       edgecolors="white", linewidth=0.3)
        ax.broken_barh([(start, width)], (row[f"queue {e['queue']}"] - 0.4, 0.8),
                       facecolors=color, edgecolors="white", linewidth=0.3, alpha=0.55)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(list(reversed(lanes)))
    ax.set_xlabel("modelled time (ms)")
    end = max((e["start_ns"] + e["duration_ns"] for e in events), default=0) / unit
    ax.set_xlim(0, end * 1.01 or 1)
    ax.set_title(title, fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS), loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8,
              title="operation", title_fontsize=8, frameon=False)
    ax.text(1.005, 0.0, "compute bar height:\nshare of units used", transform=ax.transAxes,
            fontsize=7, va="bottom", color="#555555")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="edge-npu")
    parser.add_argument("--queues", type=int, default=1)
    parser.add_argument("--trace", default="", help="an EmuDevice.export_trace JSON file")
    parser.add_argument("--output", default="emu-timeline.png")
    args = parser.parse_args()
    try:
        import matplotlib  # noqa: F401  (checked before the model runs)
    except ImportError:
        print("emu_timeline.py: drawing needs matplotlib, the `plot` extra: pip install "
              "'.[plot]' (in the checkout) or pip install matplotlib", file=sys.stderr)
        sys.exit(2)
    events, title = (trace_events(args.trace) if args.trace
                     else mobilenet_events(args.preset, args.queues))
    plot(events, title, args.output)
    print(f"wrote {args.output} ({len(events)} operations)")


if __name__ == "__main__":
    main()
