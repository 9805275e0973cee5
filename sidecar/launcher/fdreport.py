"""fds.json: the fd tables of the launcher's tree, for a sidecar under another UID, which cannot read
them itself (that takes the same UID or CAP_SYS_PTRACE)."""

from __future__ import annotations

import os
import time
from typing import Any

from .output import log
from .proc import alive_descendants, live_thread, start_ticks
from .protocol.fds import DIR_FLAGS, classify_fds, fd_links, fd_report_json
from .protocol.files import atomic_write_json
from .protocol.names import FD_REPORT_FILE, FD_REPORT_MAX_PROCESSES

# A table whose fd count is unchanged is re-classified only every this many reports: the readlinks
# are nearly all the cost, counts stay exact, and a change of classes at an equal count shows within
# this many intervals.
FD_CLASSES_EVERY = 4


class FdReporter:
    """The tables of fds.json, one report after another (see FD_CLASSES_EVERY)."""

    def __init__(self) -> None:
        self._known: dict[tuple[int, int], tuple[int, dict[str, int], int]] = {}

    def tables(self, pids: list[int]) -> list[dict[str, Any]]:
        known, self._known = self._known, {}
        found = []
        for pid in pids:
            table = self._table(pid, known)
            if table is not None:
                found.append(table)
        return found

    def _table(
        self, pid: int, known: dict[tuple[int, int], tuple[int, dict[str, int], int]]
    ) -> dict[str, Any] | None:
        tid = live_thread(pid)  # a leader that exited has no fd table of its own: its threads do
        where = f"/proc/{pid}" if tid in (None, pid) else f"/proc/{pid}/task/{tid}"
        try:
            pid_fd = os.open(where, DIR_FLAGS)
        except OSError:
            return None
        try:
            ticks = start_ticks(pid)
            if ticks is None:
                return None
            count, classes, age = self._classes(pid_fd, known.get((pid, ticks)))
        except OSError:
            return None
        finally:
            os.close(pid_fd)
        self._known[(pid, ticks)] = (count, classes, age)
        return {"pid": pid, "start_ticks": ticks, "fd_count": count, "fd_classes": classes}

    @staticmethod
    def _classes(
        pid_fd: int, previous: tuple[int, dict[str, int], int] | None
    ) -> tuple[int, dict[str, int], int]:
        """(count, classes, reports since they were read); OSError when the process is gone."""
        dir_fd = os.open("fd", DIR_FLAGS, dir_fd=pid_fd)
        try:
            count = os.fstat(dir_fd).st_size  # the number of open fds on Linux >= 6.2, else 0
        finally:
            os.close(dir_fd)
        if previous is not None and count and previous[0] == count and previous[2] + 1 < FD_CLASSES_EVERY:
            return count, previous[1], previous[2] + 1
        found = fd_links(pid_fd, None)
        if found is None:
            raise ProcessLookupError("gone")
        links = found[0]
        return len(links), classify_fds(links), 0


class FdReports:
    """fds.json every go.json ``fd_report_s`` (monotonic schedule); never when that is None."""

    def __init__(self, run_dir: str, launch_id: str, launcher_pid: int) -> None:
        self.run_dir = run_dir
        self.launch_id = launch_id
        self.launcher_pid = launcher_pid
        self.next_at: float | None = None
        self._reporter = FdReporter()

    def report_if_due(self, now: float, interval_s: float | None) -> None:
        if interval_s is None or (self.next_at is not None and now < self.next_at):
            return
        self.next_at = now + interval_s
        pids = [self.launcher_pid, *alive_descendants(self.launcher_pid)][:FD_REPORT_MAX_PROCESSES]
        report = fd_report_json(self.launch_id, time.time(), self._reporter.tables(pids))
        try:
            atomic_write_json(os.path.join(self.run_dir, FD_REPORT_FILE), report, durable=False)
        except OSError as exc:
            log(f"cannot write {FD_REPORT_FILE}: {exc}")
