"""Opening the files a program is loaded from (modules, parameter archives).

Both kinds of file come from users and operators, so both are opened the same way: only
a regular file is accepted, and opening never blocks (a FIFO or device placed where a
file is expected is refused at once instead of hanging the loader, and with it whatever
lock the caller holds). Errors name the path and what it was meant to be.
"""

from __future__ import annotations

import os
import stat

from ..errors import InvalidArgumentError, NotFoundError, PermissionDeniedError

__all__ = ["open_regular_file"]


def open_regular_file(path: str | os.PathLike, what: str,
                      writable: bool = False) -> tuple[int, os.stat_result]:
    """An open descriptor of the regular file `path` and its status; the caller closes
    it. `what` names the file in errors ("module file", "parameter file"): NOT_FOUND when
    it does not exist, PERMISSION_DENIED when it cannot be read, INVALID_ARGUMENT for a
    directory, anything but a regular file, or another failure to open."""
    origin = os.fspath(path)
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise NotFoundError(f"{origin}: {what} not found") from None
    except PermissionError:
        raise PermissionDeniedError(f"{origin}: {what} cannot be read") from None
    except OSError as exc:
        raise InvalidArgumentError(f"{origin}: {what} cannot be opened: "
                                   f"{exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InvalidArgumentError(f"{origin}: is a directory, not a {what}")
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgumentError(f"{origin}: {what}: not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st
