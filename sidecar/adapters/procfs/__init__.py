"""Process-tree sampler over /proc, in psutil's vocabulary (status names, boot time).

Cost is dominated by one readlink per open fd (about 3 us of kernel time each here), so
everything around it is kept lean: per-process data comes from one read of ``stat`` plus
``cmdline`` (psutil's ``oneshot`` costs about 9x more per process: five file reads and object
overhead), the tree from the per-thread ``children`` files (psutil's ``children()`` scans every
process of the system), readlinks go through a directory fd (one path component resolved per
fd), and fd targets are classified in bulk by sorting them and counting prefix ranges.

Identity is ``(pid, start_ticks)``. Each process is read through one handle on its
``/proc/<pid>`` directory, which the kernel binds to that process rather than to the number: once
it exits, reads through the handle fail, even if the PID is reused meanwhile. So a sample never
mixes two processes' data, and a remembered identity is matched by PID and start ticks.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence

import psutil

from sidecar.core.redaction import DEFAULT_RULES, RedactionRules, redacted_line
from sidecar.core.samples import COMMAND_MAX_CHARS, FD_CLASSES, ProcessInfo, ProcessTreeSample
from sidecar.launcher.protocol.fds import FdTable, classify_fds, fd_dir_size, fd_links
from sidecar.launcher.protocol.names import CMDLINE_READ_BYTES

from .memory import ProcfsTrainerMemory
from .threads import (
    DEAD,
    DIR_FLAGS,
    NUM_THREADS,
    PPID,
    PROC,
    RSS,
    STARTTIME,
    STATE,
    is_exiting,
    live_task,
    read_at,
    same_process_alive,
    stat_fields,
    tracer_of,
)

__all__ = ["ProcfsProcessTable", "ProcfsTrainerMemory", "is_exiting", "same_process_alive"]

_PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
# Bytes of redacted commands the sampler remembers from one sample to the next (_Commands).
COMMAND_CACHE_BYTES = 8 * 1024 * 1024
_ENTRY_OVERHEAD = 160  # a dict entry, its 16-byte key and the str's header, generously
# Samples between full readings of a process's fd classes while its fd count does not change
# (a minute at the default 5 s interval).
FD_CLASS_REFRESH = 12

_STATES = {
    "R": psutil.STATUS_RUNNING,
    "S": psutil.STATUS_SLEEPING,
    "D": psutil.STATUS_DISK_SLEEP,
    "T": psutil.STATUS_STOPPED,
    "t": psutil.STATUS_TRACING_STOP,
    "Z": psutil.STATUS_ZOMBIE,
    "X": psutil.STATUS_DEAD,
    "x": psutil.STATUS_DEAD,
    "K": "wake-kill",  # psutil names it but exports no constant
    "W": psutil.STATUS_WAKING,
    "P": psutil.STATUS_PARKED,
    "I": psutil.STATUS_IDLE,
}


def _children(pid_fd: int) -> list[int]:
    """Children of every thread of the process (a child belongs to the thread that forked it)."""
    try:
        task_fd = os.open("task", DIR_FLAGS, dir_fd=pid_fd)
    except OSError:
        return []
    children: list[int] = []
    try:
        for tid in os.listdir(task_fd):
            try:
                listing = read_at(task_fd, f"{tid}/children")
            except OSError:
                continue
            children.extend(int(value) for value in listing.split())
    except OSError:
        return []
    finally:
        os.close(task_fd)
    return children


def _command(cmdline: bytes, max_chars: int, rules: RedactionRules) -> str:
    # Arguments are NUL-separated and NUL-terminated; the environment is never read. Only the first
    # CMDLINE_READ_BYTES are read: what a hostile argv costs to redact is bounded per process. Secrets
    # are redacted argument by argument before the line is joined and truncated.
    argv = cmdline.rstrip(b"\0").decode("utf-8", errors="replace").split("\0")
    return redacted_line(argv, max_chars, rules)


class _Commands:
    """Redacted command lines by a digest of the raw cmdline, remembered for the processes of the
    last sample: redaction costs more than reading, and a command line seldom changes. Keyed by the
    digest, not the cmdline itself (up to CMDLINE_READ_BYTES each), and bounded in bytes: at most
    ``max_bytes`` of commands are remembered (what the trainer's argv costs the sidecar's memory
    does not grow with its process count beyond that; a command past it is redacted again at each
    sample, and held only by the sample that reads it, at most ``max_chars`` long)."""

    def __init__(self, max_chars: int, rules: RedactionRules, max_bytes: int = COMMAND_CACHE_BYTES) -> None:
        self._max_chars = max_chars
        self._rules = rules
        self._max_bytes = max_bytes
        self._last: dict[bytes, str] = {}
        self._next: dict[bytes, str] = {}
        self._next_bytes = 0

    @property
    def cached_bytes(self) -> int:
        """What the commands remembered for the next sample take, as counted against the bound."""
        return self._next_bytes

    def new_sample(self) -> None:
        self._last, self._next = self._next, {}
        self._next_bytes = 0

    def __call__(self, cmdline: bytes) -> str:
        key = hashlib.blake2b(cmdline, digest_size=16).digest()
        command = self._last.get(key)
        if command is None:
            command = _command(cmdline, self._max_chars, self._rules)
        if key not in self._next:
            cost = _ENTRY_OVERHEAD + 4 * len(command)  # a str's worst case: 4 bytes a character
            if self._next_bytes + cost <= self._max_bytes:
                self._next[key] = command
                self._next_bytes += cost
        return command


class ProcfsProcessTable:
    """Samples a process tree; implements ``sidecar.core.ports.ProcessTable``.

    The tree is the root and its descendants (children of every thread, recursively) plus the
    processes of the previous sample that are still alive as the same process even if they left
    the tree (orphans reparented outside it when an intermediate parent died), so a leaked
    daemon stays visible until it exits. Only identities of the previous sample are kept, so
    memory stays bounded by the tree size.

    ``start_time`` (epoch) is derived from the start ticks and the boot time read once here, so
    it stays identical across samples even if the wall clock is stepped; identity checks use
    the ticks. What each process's fd table looked like is kept from one sample to the next
    (same bound): the fd count is exact in every sample, but while it stays the same the classes
    are taken from the last full reading, renewed every ``fd_class_refresh`` samples (the
    readlink of every fd, the floor of a full reading, is then paid once per refresh instead of
    once per sample); a table with holes keeps its fd names, so its fd dir is not listed again.
    """

    def __init__(
        self,
        *,
        command_max_chars: int = COMMAND_MAX_CHARS,
        redaction: RedactionRules = DEFAULT_RULES,
        fd_reports: Callable[[], Mapping[tuple[int, int], FdTable]] | None = None,
        fd_class_refresh: int = FD_CLASS_REFRESH,
    ) -> None:
        self._commands = _Commands(command_max_chars, redaction)
        # Another UID's fd tables, as its launcher reported them (sidecar.launcher fds.json).
        self._fd_reports = fd_reports
        self._reported: Mapping[tuple[int, int], FdTable] = {}
        self._boot_time = psutil.boot_time()
        self._clock_ticks = os.sysconf("SC_CLK_TCK")
        self._root: int | None = None
        self._previous: dict[int, int] = {}
        self._fd_memory = _FdMemory(fd_class_refresh)

    def sample(self, root_pid: int) -> ProcessTreeSample:
        if root_pid != self._root:
            self._root = root_pid
            self._previous = {}
        found: dict[int, ProcessInfo] = {}
        self._fd_memory.new_sample()
        self._commands.new_sample()
        self._reported = self._fd_reports() if self._fd_reports is not None else {}
        self._walk(root_pid, None, found)
        for pid, ticks in self._previous.items():
            if pid not in found:
                self._walk(pid, ticks, found)
        self._previous = {
            pid: info.start_ticks for pid, info in found.items() if info.start_ticks is not None
        }
        return _tree(sorted(found.values(), key=lambda info: info.pid))

    def still_alive(self, known: Sequence[ProcessInfo]) -> list[ProcessInfo]:
        """Fresh snapshots of those of ``known`` running as the same process (zombies included)."""
        alive: list[ProcessInfo] = []
        for old in known:
            expected = old.start_ticks
            if expected is None:
                expected = round((old.start_time - self._boot_time) * self._clock_ticks)
            snapshot = self._snapshot(old.pid, expected)
            if snapshot is not None:
                alive.append(snapshot[0])
        return alive

    def kill(self, processes: Sequence[ProcessInfo]) -> None:
        """SIGKILL those of ``processes`` still running as the same process; never pid 1 or below
        or the sidecar itself, whatever the list holds."""
        for info in self.still_alive([p for p in processes if p.pid > 1 and p.pid != os.getpid()]):
            with contextlib.suppress(psutil.Error, OSError):
                psutil.Process(info.pid).kill()

    def kill_group(self, leader_pid: int, leader_ticks: int) -> None:
        """SIGKILL the group ``leader_pid`` leads while it runs as itself (PID-reuse-safe) and leads
        it; never pid 1 or below, the sidecar itself or the sidecar's own group."""
        if leader_pid <= 1 or leader_pid in (os.getpid(), os.getpgrp()):
            return
        if not same_process_alive(leader_pid, leader_ticks):
            return
        with contextlib.suppress(OSError):
            if os.getpgid(leader_pid) == leader_pid:
                os.killpg(leader_pid, signal.SIGKILL)

    def is_alive(self, pid: int, start_ticks: int | None) -> bool:
        return same_process_alive(pid, start_ticks)

    def is_exiting(self, pid: int, start_ticks: int | None) -> bool:
        return is_exiting(pid, start_ticks)

    def environ(self, pid: int) -> Mapping[str, str] | None:
        """The process's environment as it started, None when unreadable."""
        try:
            return psutil.Process(pid).environ()
        except (psutil.Error, OSError):
            return None

    def _walk(self, pid: int, expected_ticks: int | None, found: dict[int, ProcessInfo]) -> None:
        pending: list[tuple[int, int | None]] = [(pid, expected_ticks)]
        while pending:
            current, expected = pending.pop()
            if current in found:
                continue
            snapshot = self._snapshot(current, expected)
            if snapshot is None:
                continue
            info, children = snapshot
            found[current] = info
            pending.extend((child, None) for child in children if child not in found)

    def _snapshot(self, pid: int, expected_ticks: int | None) -> tuple[ProcessInfo, list[int]] | None:
        """One process and its children; None when gone, unreadable or not the expected process."""
        try:
            pid_fd = os.open(f"{PROC}/{pid}", DIR_FLAGS)
        except OSError:
            return None
        live_fd = pid_fd
        try:
            fields = stat_fields(read_at(pid_fd, "stat"))
            ticks = int(fields[STARTTIME])
            if expected_ticks is not None and ticks != expected_ticks:
                return None
            if fields[STATE] in DEAD:
                # A leader that left while its threads run has no memory, fds or argv of its own:
                # read them through a live thread (the start ticks stay the leader's).
                live_fd = live_task(pid_fd, pid) or pid_fd
                if live_fd != pid_fd:
                    fields = stat_fields(read_at(live_fd, "stat"))
            ppid, threads = int(fields[PPID]), int(fields[NUM_THREADS])
            rss_kib = int(fields[RSS]) * _PAGE_KIB
            state = fields[STATE].decode()
            cmdline = read_at(live_fd, "cmdline", CMDLINE_READ_BYTES)
            children = _children(pid_fd)
            fds = self._fd_table(live_fd, pid, ticks)
        except (OSError, IndexError, ValueError):
            return None
        finally:
            if live_fd != pid_fd:
                os.close(live_fd)
            os.close(pid_fd)
        if fds is None:
            return None
        fd_count, fd_classes = fds
        # Built from typed values read above: validation would only cost time.
        info = ProcessInfo.model_construct(
            pid=pid,
            ppid=ppid,
            start_time=self._boot_time + ticks / self._clock_ticks,
            start_ticks=ticks,
            rss_kib=rss_kib,
            fd_count=fd_count,
            fd_classes=fd_classes,
            threads=threads,
            state=_STATES.get(state, state),
            command=self._commands(cmdline),
        )
        return info, children

    def _fd_table(self, pid_fd: int, pid: int, ticks: int) -> tuple[int, dict[str, int]] | None:
        """Count and classes of the fds; None when the process is gone. Another user's table is
        read off its launcher's report (none yet: zero)."""
        memory, key = self._fd_memory, (pid, ticks)
        try:
            unchanged = memory.unchanged(key, fd_dir_size(pid_fd))
            if unchanged is not None:
                return unchanged
            fds = fd_links(pid_fd, memory.names(key))
        except PermissionError:
            reported = self._reported.get(key)
            return (0, {}) if reported is None else (reported.fd_count, _known_classes(reported.fd_classes))
        if fds is None:
            return None
        links, names = fds
        count, classes = len(links), classify_fds(links)
        memory.read(key, count, classes, names)
        return count, classes

    def tracer(self, pid: int) -> int | None:
        return tracer_of(pid)

    def fd_tables_readable(self, pid: int) -> bool:
        """Whether this process may read ``pid``'s fd table (same UID or CAP_SYS_PTRACE)."""
        try:
            os.close(os.open(f"{PROC}/{pid}/fd", DIR_FLAGS))
        except PermissionError:
            return False
        except OSError:
            return True  # gone: nothing to report either way
        return True


def _known_classes(claimed: Mapping[str, int]) -> dict[str, int]:
    """A launcher's report names classes as it likes (it is the trainer's to write): a name that is
    not one of FD_CLASSES counts as other, so a sample holds at most those eight, short names."""
    classes: dict[str, int] = {}
    for name, count in claimed.items():
        label = name if name in FD_CLASSES else "other"
        classes[label] = classes.get(label, 0) + count
    return classes


_Key = tuple[int, int]  # (pid, start ticks)


class _FdMemory:
    """Each process's last full fd reading, kept for one sample (the next sample's are new)."""

    def __init__(self, refresh: int) -> None:
        self._refresh = max(1, refresh)
        # (pid, ticks) -> (fd count, classes, fd names unless 0..n-1, samples since read)
        self._last: dict[_Key, tuple[int, dict[str, int], list[str] | None, int]] = {}
        self._next: dict[_Key, tuple[int, dict[str, int], list[str] | None, int]] = {}

    def new_sample(self) -> None:
        self._last, self._next = self._next, {}

    def unchanged(self, key: _Key, count: int | None) -> tuple[int, dict[str, int]] | None:
        """The last reading when the table still holds as many fds and is not due for a refresh;
        ``count`` None (a kernel that does not tell it) never matches."""
        last = self._last.get(key)
        if last is None or count is None or last[0] != count or last[3] + 1 >= self._refresh:
            return None
        self._next[key] = (*last[:3], last[3] + 1)
        return count, dict(last[1])

    def names(self, key: _Key) -> list[str] | None:
        last = self._last.get(key)
        return None if last is None else last[2]

    def read(
        self, key: tuple[int, int], count: int, classes: dict[str, int], names: list[str] | None
    ) -> None:
        self._next[key] = (count, classes, names, 0)


def _tree(processes: list[ProcessInfo]) -> ProcessTreeSample:
    fd_totals: dict[str, int] = {}
    for info in processes:
        for label, count in info.fd_classes.items():
            fd_totals[label] = fd_totals.get(label, 0) + count
    return ProcessTreeSample(
        process_count=len(processes),
        zombie_count=sum(1 for info in processes if info.state == psutil.STATUS_ZOMBIE),
        rss_kib_total=sum(info.rss_kib for info in processes),
        fd_count_total=sum(info.fd_count for info in processes),
        fd_classes_total=dict(sorted(fd_totals.items())),
        threads_total=sum(info.threads for info in processes),
        processes=processes,
    )
