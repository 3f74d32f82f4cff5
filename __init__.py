"""tinyhal: an asynchronous HAL and task-scheduler runtime for IREE-compiled programs.

Runs `.vmfb` modules compiled by IREE 3.13 with the same bits as IREE's runtime:

    import numpy as np, tinyhal
    with tinyhal.load("model.vmfb", device="task") as module:   # "sync", "task", "emu"
        y = module.main(np.ones((1, 4), np.float32))

`tinyhal.load` is the entry point (`help(tinyhal.load)`); failures raise `tinyhal.Error`
(its `code` a `tinyhal.StatusCode`). The layers below it: `tinyhal.vm` (the bytecode VM,
contexts, native modules written in Python), `tinyhal.hal` (devices, buffers, command
buffers, `Semaphore`/`Fence` and the `SemaphoreList` queue operations wait on and
signal), `tinyhal.scheduler` (worker threads, the trio bridge) and `tinyhal.server`
(`tinyhal-serve`). The commands `tinyhal-run`, `tinyhal-check` and `tinyhal-serve` take
`--help`.
"""

from __future__ import annotations

from typing import Any

from .errors import Error, StatusCode

__all__ = ["Error", "StatusCode", "load"]
__version__ = "0.1.0"


def load(path_or_bytes: Any, device: Any = "task", **options: Any) -> Any:
    """Loads an IREE-compiled `.vmfb` (a path or its bytes) and returns a
    `tinyhal.vm.Module` whose exports are called with numpy arrays and return them.

    `device` is a driver name, `"sync"` (the calling thread), `"task"` (worker threads,
    the default) or `"emu"` (an emulated accelerator, `"emu://edge-npu"` a preset), a
    `tinyhal.hal.Device`, or a list of them for a program compiled for several devices.
    Keyword options: `parameters=` (the weights of a program compiled with external
    parameters: a `.irpa`/`.safetensors`/`.gguf` path, or `{scope: path}`), `modules=`
    (native modules written in Python the program imports), `mapped=True` (map the file
    instead of reading it), and the driver's options (`executable_policy="portable"`).
    Mistakes raise `tinyhal.Error` naming what was wrong (a missing file is NOT_FOUND).
    The module holds its device: close it (or use `with`). `help(tinyhal.vm.load)` has
    every detail.

    >>> import numpy as np, tinyhal
    >>> from importlib.resources import files
    >>> saxpy = files("tinyhal.server.models") / "saxpy" / "1" / "model.vmfb"
    >>> with tinyhal.load(str(saxpy), device="sync") as module:   # y = alpha * x + y
    ...     module.saxpy(np.float32(2), np.array([1, 2, 3], np.float32),
    ...                  np.ones(3, np.float32))
    array([3., 5., 7.], dtype=float32)
    """
    from .vm import load as _load

    return _load(path_or_bytes, device=device, **options)
