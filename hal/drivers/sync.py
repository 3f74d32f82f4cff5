"""The `sync` driver: work runs inline on the thread that makes it ready.

A submission whose waits are already reached runs on the submitting thread before
`submit` returns; one that waits runs on whichever thread signals its last wait. There are
no threads of its own, which makes it the embedded-systems path and the reference for the
other drivers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ...errors import as_error
from ..device import Completion, Device, run_capturing
from ..execution import Submission
from ..stream import run_alone


class SyncDevice(Device):
    driver_name = "sync"
    identifier = "local-sync"

    # -- driver contract --------------------------------------------------------------

    completes_inline = True
    profiles_submissions = True

    def _execute(self, ops: Submission, done: Completion, submission_id: int = 0) -> None:
        profile = self.profile
        if profile is not None and profile.records_host_execution:
            from ..profile import run_profiled

            done(run_capturing(functools.partial(run_profiled, ops, profile, "inline",
                                                 submission_id=submission_id)))
            return
        try:
            run_alone(ops)
        except BaseException as exc:  # noqa: BLE001 - becomes the submission's error
            done(as_error(exc))
            return
        done(None)

    def _call(self, work: Callable[[], None], done: Completion) -> None:
        done(run_capturing(work))
