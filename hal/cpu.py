"""This CPU as IREE's runtime describes it: the processor data executables receive in
their environment, and the answers to `hal.cpu` device queries.

IREE reads the CPU once (CPUID on x86-64) into a few 64-bit words whose bit layout is its
`cpu_feature_bits` table; an executable compiled for a generic CPU picks its micro-kernel
paths from word 0, and modules ask `hal.cpu :: <feature>` to choose between variants. Both
must see what IREE's runtime would report, or the same module could run other code. On
architectures other than x86-64 the words are zero and no feature name is known.
"""

from __future__ import annotations

import os

from .native import ffi, lib

PROCESSOR_DATA_WORDS = 8

_X86_64_FEATURE_BITS = {
    "sse3": 0, "ssse3": 1, "sse4.1": 2, "sse4.2": 3, "sse4a": 4,
    "avx": 10, "fma": 11, "fma4": 12, "xop": 13, "f16c": 14, "avx2": 15,
    "avx512f": 20, "avx512cd": 21, "avx512vl": 22, "avx512dq": 23, "avx512bw": 24,
    "avx512ifma": 25, "avx512vbmi": 26, "avx512vpopcntdq": 27, "avx512vnni": 28,
    "avx512vbmi2": 29, "avx512bitalg": 30, "avx512bf16": 31, "avx512fp16": 32,
    "amx-tile": 50, "amx-int8": 51, "amx-bf16": 52,
}

# os.uname, not platform.machine(): importing platform costs a few ms of every start-up
_MACHINE = (os.uname().machine if hasattr(os, "uname")
            else os.environ.get("PROCESSOR_ARCHITECTURE", ""))
FEATURE_BITS: dict[str, int] = _X86_64_FEATURE_BITS if _MACHINE in ("x86_64", "AMD64") else {}
"""Feature name (LLVM's spelling, as IREE keys `hal.cpu` queries) -> its bit in word 0."""


def _read_processor_data() -> tuple[int, ...]:
    words = ffi.new("uint64_t[]", PROCESSOR_DATA_WORDS)
    lib.tinyhal_cpu_data(words, PROCESSOR_DATA_WORDS)
    return tuple(words)


PROCESSOR_DATA: tuple[int, ...] = _read_processor_data()


def cpu_feature(name: str) -> bool | None:
    """Whether this CPU has feature `name` as IREE reports it; None when IREE does not
    know the name on this architecture (its query then answers NOT_FOUND)."""
    bit = FEATURE_BITS.get(name)
    return None if bit is None else bool(PROCESSOR_DATA[0] >> bit & 1)
