"""fds.json and the fd tables behind it. Both sides read a process's fd table with ``fd_links`` and
classify it with ``classify_fds``, so the launcher's report and the sidecar's own reading agree."""

from __future__ import annotations

import os
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from .fields import ProtocolError, get
from .names import FD_REPORT_MAX_PROCESSES, MAX_FD_CLASSES, MAX_FD_COUNT, PROTOCOL

# Classes by readlink target prefix ("/memfd:<name> (deleted)" is how Linux names a memfd target;
# "memfd:" is kept for older kernels). The prefixes are mutually exclusive: order does not matter.
_FD_PREFIXES: tuple[tuple[str, str], ...] = (
    ("pipe:", "pipe"),
    ("socket:", "socket"),
    ("memfd:", "memfd"),
    ("/memfd:", "memfd"),
    ("/dev/nvidia", "nvidia"),
    ("/dev/shm/", "shared_memory"),
    ("/run/shm/", "shared_memory"),
)
_FD_EXACT: tuple[tuple[str, str], ...] = (
    ("anon_inode:[eventfd]", "eventfd"),
    ("anon_inode:[eventpoll]", "eventpoll"),
)
# Sorted-range bounds: every string starting with prefix p lies in [p, p[:-1] + next char).
_FD_PREFIX_RANGES = tuple(
    (prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1), label) for prefix, label in _FD_PREFIXES
)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def fd_class(link: str) -> str:
    """Class of one fd from its readlink target."""
    for prefix, label in _FD_PREFIXES:
        if link.startswith(prefix):
            return label
    for exact, label in _FD_EXACT:
        if link == exact:
            return label
    return "other"


def classify_fds(links: list[str]) -> dict[str, int]:
    """Counts per class, equal to ``fd_class`` applied to each link; sorts ``links`` in place.

    Sorting in C and counting prefix ranges by bisection costs about a quarter of a
    Python-level ``fd_class`` call per link.
    """
    links.sort()
    counts: dict[str, int] = {}
    matched = 0
    for low, high, label in _FD_PREFIX_RANGES:
        found = bisect_left(links, high) - bisect_left(links, low)
        if found:
            counts[label] = counts.get(label, 0) + found
            matched += found
    for exact, label in _FD_EXACT:
        found = bisect_right(links, exact) - bisect_left(links, exact)
        if found:
            counts[label] = found
            matched += found
    if len(links) > matched:
        counts["other"] = len(links) - matched
    return dict(sorted(counts.items()))


_FD_NAMES: list[str] = []


def _fd_names(count: int) -> list[str]:
    """The names "0".."count-1" (cached: this is called for every process of every sample)."""
    while len(_FD_NAMES) < count:
        _FD_NAMES.append(str(len(_FD_NAMES)))
    return _FD_NAMES[:count]


def fd_dir_size(pid_fd: int) -> int | None:
    """How many fds the process holds, from its fd dir's size (Linux >= 6.2, in one fstat); None
    when the kernel does not tell it (size 0) or the process is gone. PermissionError as
    ``fd_links``."""
    try:
        dir_fd = os.open("fd", DIR_FLAGS, dir_fd=pid_fd)
    except PermissionError:
        raise
    except OSError:
        return None
    try:
        return os.fstat(dir_fd).st_size or None
    except OSError:
        return None
    finally:
        os.close(dir_fd)


def fd_links(pid_fd: int, guess: list[str] | None) -> tuple[list[str], list[str] | None] | None:
    """Readlink targets of the open fds, and their fd names when they are not simply 0..n-1.

    None when the process is gone; PermissionError when its fd dir is another user's (reading
    it takes the same UID or CAP_SYS_PTRACE). On Linux >= 6.2 the fd dir's size is
    its number of open fds, n. When n candidate names all resolve, they are exactly the open
    fds, and the directory listing (a third of the kernel cost) is skipped. Candidates are the
    names seen last time (``guess``) when there were n of them, else 0..n-1: fds are allocated
    lowest first, so a table without holes is the common case.
    """
    try:
        dir_fd = os.open("fd", DIR_FLAGS, dir_fd=pid_fd)
    except PermissionError:
        raise
    except OSError:
        return None
    try:
        readlink = partial(os.readlink, dir_fd=dir_fd)
        count = os.fstat(dir_fd).st_size
        if count:
            names = guess if guess is not None and len(guess) == count else None
            try:
                return list(map(readlink, names or _fd_names(count))), names
            except OSError:
                pass  # the table has changed or has holes: list it instead
        names = os.listdir(dir_fd)
        try:
            links = list(map(readlink, names))
        except OSError:
            # An fd closed between listing and reading: redo one by one, skipping it.
            links = []
            kept: list[str] = []
            for name in names:
                try:
                    links.append(readlink(name))
                except OSError:
                    continue
                kept.append(name)
            names = kept
        return links, None if names == _fd_names(len(names)) else names
    except OSError:
        return None
    finally:
        os.close(dir_fd)


@dataclass(frozen=True)
class FdTable:
    """One process's fd count and classes, as the launcher reported them in fds.json."""

    fd_count: int
    fd_classes: Mapping[str, int]


def fd_report_json(launch_id: str, written_unix: float, processes: list[dict[str, Any]]) -> dict[str, Any]:
    """fds.json; each process entry is {pid, start_ticks, fd_count, fd_classes}."""
    return {
        "protocol": PROTOCOL,
        "launch_id": launch_id,
        "written_unix": written_unix,
        "processes": processes,
    }


def parse_fd_report(raw: Mapping[str, Any], launch_id: str) -> dict[tuple[int, int], FdTable]:
    """fds.json by (pid, start ticks). The trainer can write the run dir, so this is its word on its
    own fd tables: bounded and typed, and a report of another launch counts as none."""
    if raw.get("launch_id") != launch_id:
        return {}
    entries = get(raw, "processes", list)
    if len(entries) > FD_REPORT_MAX_PROCESSES:
        raise ProtocolError(f"run dir record: fds.json lists {len(entries)} processes")
    tables: dict[tuple[int, int], FdTable] = {}
    for entry in entries:
        pid, ticks, count = (
            get(entry, "pid", int),
            get(entry, "start_ticks", int),
            get(entry, "fd_count", int),
        )
        classes = get(entry, "fd_classes", Mapping)
        if not 0 <= count <= MAX_FD_COUNT or len(classes) > MAX_FD_CLASSES:
            raise ProtocolError(f"run dir record: fds.json entry of pid {pid} is out of bounds")
        if not all(
            isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= count for n in classes.values()
        ):
            raise ProtocolError(f"run dir record: fds.json classes of pid {pid} are not counts")
        tables[(pid, ticks)] = FdTable(fd_count=count, fd_classes={str(k): v for k, v in classes.items()})
    return tables
