"""Local mode's catch for processes that leave the launcher's tree (the Strays port).

The sidecar makes itself a child subreaper: an orphan whose launcher was killed, or a process that a
tracer made the launcher clone beside itself (``clone(CLONE_PARENT)``), then becomes the sidecar's
child instead of init's, and the end of the attempt finds, kills and names it. Pod mode needs none
of this: the trainer container's processes end with the container.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Sequence

from sidecar.core.redaction import RedactionRules
from sidecar.core.samples import ProcessInfo

from . import ProcfsProcessTable

PR_SET_CHILD_SUBREAPER = 36


class SubreaperStrays:
    """Makes this process a child subreaper when built (the CLI's local runs only: a test process
    that became one would adopt every orphan of its other tests)."""

    def __init__(self, redaction: RedactionRules) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(err)}")
        self._own = os.getpid()
        self._table = ProcfsProcessTable(redaction=redaction)

    def find(self, launcher_pid: int) -> list[ProcessInfo]:
        try:
            tree = self._table.sample(self._own)
        except OSError:
            return []
        launcher_tree = _descendants(tree.processes, launcher_pid)
        return [p for p in tree.processes if p.pid != self._own and p.pid not in launcher_tree]

    def reap(self, processes: Sequence[ProcessInfo]) -> None:
        for process in processes:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(process.pid, os.WNOHANG)


def _descendants(processes: Sequence[ProcessInfo], root: int) -> set[int]:
    found, grew = {root}, True
    while grew:
        more = {p.pid for p in processes if p.ppid in found} - found
        grew = bool(more)
        found |= more
    return found
