"""Reading a process's ``stat`` through /proc, and whether it is alive: a process lives while any
of its threads does. A leader thread that left (pthread_exit, SYS_exit) while others run shows
state Z and no memory, fds or argv in /proc/PID; its live threads' /proc/PID/task/TID show them."""

from __future__ import annotations

import contextlib
import os

PROC = "/proc"
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# Indexes into the stat fields after the command name: field N of proc(5) is index N - 3.
STATE, PPID, FLAGS, NUM_THREADS, STARTTIME, RSS = 0, 1, 6, 17, 19, 21
_PF_EXITING = 0x4  # task flag: the process is inside exit()


def stat_fields(stat: bytes) -> list[bytes]:
    """The fields of a ``stat`` file after the command name, state first."""
    # The command name may hold spaces and parentheses: split after its closing one.
    return stat.rsplit(b")", 1)[-1].split()


def _read_stat(pid: int) -> list[bytes] | None:
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as handle:
            return stat_fields(handle.read())
    except OSError:
        return None


DEAD = (b"Z", b"X", b"x")


def _live_stat(pid: int) -> list[bytes] | None:
    """The stat fields of ``pid``'s leader; when the leader thread has exited while others run (its
    own stat says Z), with a live thread's state and flags: the process is alive while any thread
    is. The start ticks stay the leader's (the process's identity; a thread starts later)."""
    fields = _read_stat(pid)
    if not fields or fields[STATE] not in DEAD:
        return fields
    try:
        with os.scandir(f"{PROC}/{pid}/task") as tasks:
            tids = [entry.name for entry in tasks if entry.name != str(pid)]
    except OSError:
        return fields
    for tid in tids:
        try:
            with open(f"{PROC}/{pid}/task/{tid}/stat", "rb") as handle:
                thread = stat_fields(handle.read())
        except OSError:
            continue
        if len(thread) > FLAGS and thread[STATE] not in DEAD:
            live = list(fields)
            live[STATE], live[FLAGS] = thread[STATE], thread[FLAGS]
            return live
    return fields


def same_process_alive(pid: int, start_ticks: int | None) -> bool:
    """True while ``pid`` has a live thread; with ``start_ticks``, only as that process."""
    fields = _live_stat(pid)
    if not fields or fields[STATE] in DEAD:
        return False
    return start_ticks is None or (len(fields) > STARTTIME and int(fields[STARTTIME]) == start_ticks)


def is_exiting(pid: int, start_ticks: int | None) -> bool:
    """True when ``pid`` is exiting, a zombie, gone, or another process (PID reuse)."""
    fields = _live_stat(pid)
    if fields is None or len(fields) <= STARTTIME or fields[STATE] in DEAD:
        return True
    if start_ticks is not None and int(fields[STARTTIME]) != start_ticks:
        return True
    return bool(int(fields[FLAGS]) & _PF_EXITING)


def read_at(dir_fd: int, name: str, limit: int = 1 << 20) -> bytes:
    """At most ``limit`` bytes of a /proc file (a trainer's argv may be megabytes)."""
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        chunks: list[bytes] = []
        size = 0
        while size < limit and (chunk := os.read(fd, min(65536, limit - size))):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def live_task(pid_fd: int, pid: int) -> int | None:
    """A directory fd of a thread of the process that has not exited (not the leader); None."""
    try:
        tids = [tid for tid in os.listdir(f"{PROC}/{pid}/task") if tid != str(pid)]
    except OSError:
        return None
    for tid in tids:
        try:
            task_fd = os.open(f"task/{tid}", DIR_FLAGS, dir_fd=pid_fd)
        except OSError:
            continue
        try:
            if stat_fields(read_at(task_fd, "stat"))[STATE] not in DEAD:
                return task_fd
        except (OSError, IndexError):
            pass
        os.close(task_fd)
    return None


def tracer_of(pid: int) -> int | None:
    """The TracerPid of ``pid``'s status: who ptraces it; None when none does or it is unreadable."""
    try:
        pid_fd = os.open(f"{PROC}/{pid}", DIR_FLAGS)
    except OSError:
        return None
    try:
        status = read_at(pid_fd, "status", 64 * 1024)
    except OSError:
        return None
    finally:
        os.close(pid_fd)
    for line in status.splitlines():
        if line.startswith(b"TracerPid:"):
            with contextlib.suppress(ValueError):
                found = int(line.split(b":", 1)[1])
                return found if found > 0 else None
    return None
