"""The rest of `iree-run-module`'s flags, for `tinyhal-run`.

Every flag `iree-run-module --help` (IREE 3.13) lists is either taken with its meaning
(`tinyhal.vm.run` handles those) or listed here. A flag listed here is accepted at IREE's
default value, so a flagfile written from `iree-run-module --help` (which is one) runs
unchanged; another value is refused with one line saying why it has no meaning in
tinyhal. A few have a tinyhal meaning (`TASK_FLAGS`: the task driver's worker count and
spin; `--module_mode`: every module file is mapped privately either way).

`--flagfile=PATH` is expanded where it stands (one flag per line, `#` comments), as
IREE's tools parse it; later flags override earlier ones.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidArgumentError, UnimplementedError

__all__ = ["DEVICE_ALLOCATORS", "EXIT_USAGE", "NO_MEANING", "TASK_FLAGS", "UsageParser", "check_device_allocators", "check_no_meaning",
           "expand_flagfiles", "list_devices", "list_drivers", "task_options"]

EXIT_USAGE = 2
"""The exit status of every tinyhal command for a mistake on its command line."""


class UsageParser(argparse.ArgumentParser):
    """The command-line parser of tinyhal's commands: a mistake (unknown flag, bad value,
    missing argument) is one line on stderr naming it, `PROG: error: WHAT (PROG --help
    lists the flags)`, and exit status 2, so `2>&1 | tail -1` keeps the reason; argparse's
    own usage block before it is left out (it is what `--help` prints)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} ({self.prog} --help lists "
                              f"the flags)\n")


_GPU = "tinyhal has no {0} driver (its drivers are sync, task and emu)"
_PROFILE = ("tinyhal profiles every queue, dispatch and memory event of the device; use "
            "--device_profiling_mode and --device_profiling_output")
_REPLAY = "tinyhal has no HAL replay capture (use --device_profiling_output for a trace)"
_CAPTURE = "tinyhal has no external profiler capture (use --device_profiling_output)"
_TOPOLOGY = ("tinyhal's task driver does not pin workers to a CPU topology; "
             "--task_topology_group_count / --task_topology_max_group_count set its workers")

# flag -> (IREE's default as written on the command line, why another value has no
# meaning here). A default of None: the flag has no default (any use is refused).
NO_MEANING: dict[str, tuple[str | None, str]] = {
    **{f"cuda_{f}": (d, _GPU.format("CUDA")) for f, d in (
        ("use_streams", "true"), ("allow_inline_execution", "false"),
        ("async_allocations", "true"), ("tracing", "2"), ("default_index", "0"),
        ("default_index_from_mpi", "true"))},
    **{f"hip_{f}": (d, _GPU.format("HIP")) for f, d in (
        ("use_streams", "true"), ("allow_inline_execution", "false"),
        ("async_allocations", "true"), ("async_caching", "true"), ("tracing", "2"),
        ("default_index", "0"), ("dylib_path", None))},
    **{f"vulkan_{f}": (d, _GPU.format("Vulkan")) for f, d in (
        ("validation_layers", "false"), ("debug_utils", "false"), ("debug_verbosity", "2"),
        ("tracing", "true"), ("robust_buffer_access", "false"), ("sparse_binding", "false"),
        ("sparse_residency", "false"), ("buffer_device_addresses", "true"),
        ("dispatch_abi", "all"), ("cached_bda_replay_instances", "16"),
        ("cached_bda_replay_publication_bytes", "67108864"),
        ("retained_cached_bda_replay_instances", "1"), ("dedicated_compute_queue", "true"),
        ("libvulkan_search_path", None))},
    "executable_plugin": (None, "tinyhal loads executables from the module only (no "
                          "executable plugins)"),
    "task_abort_on_failure": ("false", "a failed task fails its signal semaphores in "
                              "tinyhal; it never aborts the process"),
    "task_worker_stack_size": ("131072", "tinyhal's workers run kernels on their thread's "
                               "own stack"),
    "task_worker_local_memory": ("0", "tinyhal gives each workgroup the local memory its "
                                 "export declares"),
    "task_topology_mode": ("physical_cores", _TOPOLOGY),
    "task_topology_nodes": ("current", _TOPOLOGY),
    "task_topology_cpu_ids": (None, _TOPOLOGY),
    "task_topology_snapshot": ("", _TOPOLOGY),
    "task_topology_performance_level": ("any", _TOPOLOGY),
    "task_topology_distribution": ("scatter", _TOPOLOGY),
    "task_topology_favor": ("", _TOPOLOGY),
    "dump_task_topologies": (None, _TOPOLOGY),
    "device_lead_allocator": ("0", "tinyhal-run runs one device"),
    "device_replay_output": ("", _REPLAY),
    "device_replay_file_policy": ("reference", _REPLAY),
    "device_replay_file_validation": ("identity", _REPLAY),
    "device_profiling_filter_function": ("", _PROFILE),
    "device_profiling_filter_command_buffer": ("-1", _PROFILE),
    "device_profiling_filter_command_index": ("-1", _PROFILE),
    "device_profiling_filter_physical_device": ("-1", _PROFILE),
    "device_profiling_filter_queue": ("-1", _PROFILE),
    "device_profiling_flush_interval_ms": ("0", _PROFILE),
    "device_profiling_counter": (None, "tinyhal reads no hardware counters"),
    "print_device_statistics": ("false", _PROFILE),
    "device_capture_tool": ("", _CAPTURE),
    "device_capture_file": ("", _CAPTURE),
    "device_capture_label": ("", _CAPTURE),
    "instrument_file": ("", "tinyhal does not run IREE's instrumented programs' "
                        "instrument module"),
    "agents_md": ("false", "tinyhal-run has no replay-capture guide"),
}

# The task driver's flags with a tinyhal meaning, and IREE's defaults.
TASK_FLAGS = {"task_topology_group_count": "0", "task_topology_max_group_count": "64",
              "task_worker_spin_us": "0"}
MODULE_MODES = ("preload", "mmap")

_TRUE = {"true", "1", ""}
_FALSE = {"false", "0"}


def _same(value: str, default: str) -> bool:
    value, default = value.strip().strip('"'), default.strip().strip('"')
    if default in ("true", "false"):
        return (value.lower() in _TRUE) == (default == "true") and (
            value.lower() in _TRUE | _FALSE)
    try:
        return float(value) == float(default)
    except ValueError:
        return value == default


DEVICE_ALLOCATORS = {
    "caching": "keeps freed buffers for reuse; tinyhal's queue allocations already come "
               "from each queue's transient ringbuffer, so there is nothing to add",
    "debug": "IREE's layer fills new buffers with a pattern to expose reads of memory "
             "never written; tinyhal has no such layer (allocator buffers start zeroed, "
             "queue allocations reuse transient ringbuffer memory as it is)",
}
"""The allocator layers `iree-run-module --device_allocator=` (IREE 3.13) knows, accepted
by tinyhal-run as they change nothing it computes, each with why."""


def check_device_allocators(specs: Sequence[str]) -> list[str]:
    """The allocator names of `--device_allocator=` flags; anything but IREE's own
    `caching` and `debug` (without options) is an `InvalidArgumentError` saying why."""
    names = []
    for spec in specs:
        name, colon, options = spec.strip().partition(":")
        if name not in DEVICE_ALLOCATORS:
            raise InvalidArgumentError(
                f"--device_allocator={spec}: unrecognized allocator '{name}'; IREE's are "
                f"{' and '.join(DEVICE_ALLOCATORS)}")
        if colon:
            raise InvalidArgumentError(
                f"--device_allocator={spec}: tinyhal has no {name} layer to configure "
                f"({DEVICE_ALLOCATORS[name]})")
        names.append(name)
    return names


def check_no_meaning(flags: dict[str, list[str]]) -> None:
    """Raises for the first flag of `NO_MEANING` given with a value other than IREE's
    default; `flags` maps each flag name to the values it was given."""
    for name, values in flags.items():
        default, why = NO_MEANING[name]
        for value in values:
            if default is None or not _same(value, default):
                raise UnimplementedError(f"--{name}={value}: {why}")


def task_options(flags: dict[str, str], driver: str) -> dict[str, Any]:
    """The task driver's options for `TASK_FLAGS` given with non-default values (other
    drivers ignore them, as IREE's local-sync ignores the task system's flags)."""
    values = {}
    for name, text in flags.items():
        try:
            values[name] = int(text)
        except ValueError:
            raise InvalidArgumentError(f"--{name}={text}: not an integer") from None
        if values[name] < 0:
            raise InvalidArgumentError(f"--{name}={text}: must be >= 0")
    options: dict[str, Any] = {}
    count = values.get("task_topology_group_count", 0)
    cap = values.get("task_topology_max_group_count", 64)
    if count:
        options["workers"] = count
    elif cap and cap < (os.cpu_count() or 1):
        options["workers"] = cap
    spin = values.get("task_worker_spin_us", 0)
    if spin:
        options["helper_spin_us"] = spin
    if not options:
        return options
    from ..hal import driver_options

    taken = driver_options(driver)
    return {name: value for name, value in options.items() if name in taken}


def expand_flagfiles(argv: Sequence[str], depth: int = 0) -> list[str]:
    """`argv` with each `--flagfile=PATH` replaced by the flags in that file."""
    out: list[str] = []
    for arg in argv:
        if not arg.startswith("--flagfile="):
            out.append(arg)
            continue
        path = arg.partition("=")[2]
        if depth > 8:
            raise InvalidArgumentError(f"--flagfile={path}: flagfiles nest too deeply")
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError as exc:
            raise InvalidArgumentError(f"--flagfile={path}: {exc.strerror}") from None
        flags = []
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if not line.startswith("--"):
                raise InvalidArgumentError(
                    f"{path}:{number}: positional arguments not allowed in flag files")
            flags.append(_unquote(line))
        out.extend(expand_flagfiles(flags, depth + 1))
    return out


def _unquote(flag: str) -> str:
    """`--name="value"` as `--name=value` (flagfiles quote string values)."""
    name, eq, value = flag.partition("=")
    if eq and len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return name + eq + value


def list_drivers() -> str:
    from ..hal import available_drivers

    lines = ["# " + "=" * 76, "# Available HAL drivers", "# " + "=" * 76,
             "# Use --list_devices={driver name} to enumerate available devices.", ""]
    about = {"sync": "inline on the calling thread (local-sync)",
             "task": "worker threads, workgroups tiled across them (local-task)",
             "emu": "an emulated accelerator with its own memory and a cost model"}
    for name in available_drivers():
        lines.append(f"{name:>16}: {about.get(name, '')}")
    return "\n".join(lines) + "\n"


def list_devices(driver: str = "") -> str:
    from ..hal import available_drivers, device_uris

    out = []
    for name in available_drivers():
        if driver and driver not in (name, f"local-{name}"):
            continue
        out.append(f"{name}://")
        out.extend(device_uris(name))
    if driver and not out:
        raise InvalidArgumentError(f"--list_devices={driver}: no driver of that name")
    return "\n".join(out) + "\n"
