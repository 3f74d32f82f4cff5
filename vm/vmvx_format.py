"""The VMVX executable format's name and how its bytes are told apart, without the
implementation (`tinyhal.vm.vmvx`, whose operations are numpy and which is imported with
the first VMVX executable): `tinyhal.vm` registers the loader with these."""

from __future__ import annotations

__all__ = ["VMVX_FORMAT", "is_vmvx_module"]

VMVX_FORMAT = "vmvx-bytecode-fb"


def is_vmvx_module(data: bytes) -> bool:
    """Whether `data` looks like a VM bytecode module (a `.vmfb`, or its bare FlatBuffer)."""
    return data[:4] == b"PK\x03\x04" or data[4:8] == b"IREE"
