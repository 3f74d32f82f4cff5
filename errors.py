"""Errors carrying IREE's status codes.

Every failure tinyhal reports is a `tinyhal.Error` subclass whose `code` is the IREE
status code of the same name, so callers can branch on the code or the class and
messages can be compared with IREE's.
"""

from __future__ import annotations

import enum


class StatusCode(enum.IntEnum):
    """IREE's `iree_status_code_t` values."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16
    DEFERRED = 17
    INCOMPATIBLE = 18


class Error(Exception):
    """Base of every tinyhal error; `code` is the IREE status code."""

    code: StatusCode = StatusCode.UNKNOWN

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"

    def with_context(self, what: str) -> Error:
        """The same error (same class and code) prefixed with what was being done
        (`"fill target: ..."`); this error becomes its cause."""
        err = type(self)(f"{what}: {self.message}")
        err.__cause__ = self
        return err


_BY_CODE: dict[StatusCode, type[Error]] = {}


def _subclass(name: str, code: StatusCode) -> type[Error]:
    cls = type(name, (Error,), {"code": code, "__doc__": f"IREE status {code.name}."})
    _BY_CODE[code] = cls
    return cls


CancelledError = _subclass("CancelledError", StatusCode.CANCELLED)
UnknownError = _subclass("UnknownError", StatusCode.UNKNOWN)
InvalidArgumentError = _subclass("InvalidArgumentError", StatusCode.INVALID_ARGUMENT)
DeadlineExceededError = _subclass("DeadlineExceededError", StatusCode.DEADLINE_EXCEEDED)
NotFoundError = _subclass("NotFoundError", StatusCode.NOT_FOUND)
AlreadyExistsError = _subclass("AlreadyExistsError", StatusCode.ALREADY_EXISTS)
PermissionDeniedError = _subclass("PermissionDeniedError", StatusCode.PERMISSION_DENIED)
ResourceExhaustedError = _subclass("ResourceExhaustedError", StatusCode.RESOURCE_EXHAUSTED)
FailedPreconditionError = _subclass("FailedPreconditionError", StatusCode.FAILED_PRECONDITION)
AbortedError = _subclass("AbortedError", StatusCode.ABORTED)
OutOfRangeError = _subclass("OutOfRangeError", StatusCode.OUT_OF_RANGE)
UnimplementedError = _subclass("UnimplementedError", StatusCode.UNIMPLEMENTED)
InternalError = _subclass("InternalError", StatusCode.INTERNAL)
UnavailableError = _subclass("UnavailableError", StatusCode.UNAVAILABLE)
DataLossError = _subclass("DataLossError", StatusCode.DATA_LOSS)
IncompatibleError = _subclass("IncompatibleError", StatusCode.INCOMPATIBLE)


class DeviceLostError(UnavailableError):
    """The device was lost (an emulated loss, or a kernel that faulted): this and every
    later operation on it fails (UNAVAILABLE, as IREE reports a lost device). Create a
    new device to go on."""


class KernelFaultError(DataLossError):
    """A kernel faulted (SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGTRAP) while running a
    dispatch: the machine code is corrupt or it touched memory it does not own. The
    process survives; the device that ran it is lost, since whatever the kernel wrote
    before faulting cannot be trusted."""


def error_for_code(code: int, message: str) -> Error:
    """Builds the Error subclass for an IREE status code (UNKNOWN for unknown codes)."""
    try:
        cls = _BY_CODE[StatusCode(code)]
    except (ValueError, KeyError):
        cls = UnknownError
    return cls(message)


def as_error(exc: BaseException) -> Error:
    """Wraps any exception as an Error, keeping a tinyhal Error as it is."""
    if isinstance(exc, Error):
        return exc
    err = InternalError(f"{type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err
