"""Modules whose executables are system ELF (`--iree-llvmcpu-link-embedded=false`):
`hal.executable.format` answers for it and the dylib loads from rodata, on every driver."""

from __future__ import annotations

import numpy as np
import pytest

import tinyhal
from support.iree_tools import HOST_FLAGS, compile_mlir
from support.mutations import SYSTEM_ELF as SOURCE


@pytest.fixture(scope="module")
def system_elf_vmfb():
    return compile_mlir(SOURCE, [*HOST_FLAGS, "--iree-llvmcpu-link-embedded=false"])


@pytest.mark.parametrize("driver", ["sync", "task", "emu"])
def test_system_elf_module_matches_iree(system_elf_vmfb, driver):
    import iree.runtime as rt

    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 70)).astype(np.float32)
    b = rng.standard_normal((70, 5)).astype(np.float32)
    ctx = rt.SystemContext(config=rt.Config("local-sync"))
    ctx.add_vm_module(rt.VmModule.mmap(ctx.instance, str(system_elf_vmfb)))
    expected = [r.to_host() for r in ctx.modules.module["main"](a, b)]
    with tinyhal.load(system_elf_vmfb, device=driver) as module:
        got = module.main(a, b)
    for ours, theirs in zip(got, expected):
        assert ours.tobytes() == theirs.tobytes()
