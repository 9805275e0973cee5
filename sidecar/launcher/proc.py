"""What the launcher reads of /proc about its own tree, and the subreaper switch."""

from __future__ import annotations

import ctypes
import os
import shutil

from .protocol.files import read_bytes
from .protocol.names import CMDLINE_READ_BYTES

PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4


def _fields_after_comm(pid: int, tid: int | None = None) -> list[str] | None:
    """Fields of /proc/PID/stat (or of one of its threads) after the comm, the state (field 3) first."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path, "rb") as handle:
            raw = handle.read().decode(errors="replace")
    except OSError:
        return None
    return raw.rpartition(")")[2].split()


DEAD_STATES = ("Z", "X", "x")


def live_thread(pid: int) -> int | None:
    """A thread of pid that has not exited: the leader, or another thread of a process whose leader
    left with pthread_exit/SYS_exit (its /proc/PID shows state Z, no fds, no argv, while its other
    threads run on); None when every thread is gone."""
    fields = _fields_after_comm(pid)
    if fields and fields[0] not in DEAD_STATES:
        return pid
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        thread = _fields_after_comm(pid, int(tid)) if tid.isdigit() and int(tid) != pid else None
        if thread and thread[0] not in DEAD_STATES:
            return int(tid)
    return None


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: start time in clock ticks since boot (PID-reuse guard)."""
    fields = _fields_after_comm(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def kernel_boot_id() -> str | None:
    data = read_bytes("/proc/sys/kernel/random/boot_id")
    return data.decode().strip() if data else None


def command_of(pid: int) -> tuple[str, ...]:
    """The process's arguments (the first CMDLINE_READ_BYTES of them), or its [comm] when it has
    none (a kernel thread, a zombie): what exit.json names a killed process by."""
    tid = live_thread(pid)
    where = f"/proc/{pid}" if tid in (None, pid) else f"/proc/{pid}/task/{tid}"
    data = _read_prefix(f"{where}/cmdline", CMDLINE_READ_BYTES)
    if data:
        return tuple(part.decode(errors="replace") for part in data.rstrip(b"\0").split(b"\0"))
    comm = read_bytes(f"/proc/{pid}/comm")
    return (f"[{comm.decode(errors='replace').strip()}]",) if comm else ("?",)


def _read_prefix(path: str, limit: int) -> bytes:
    """At most ``limit`` bytes of a /proc file (a command line may be megabytes)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        chunks: list[bytes] = []
        size = 0
        while size < limit and (chunk := os.read(fd, limit - size)):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _children(pid: int) -> list[int]:
    """Children of every thread of pid (a child hangs off the thread that forked it)."""
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        data = read_bytes(f"/proc/{pid}/task/{tid}/children")
        if data:
            kids.extend(int(kid) for kid in data.split())
    return kids


def _scan_children() -> dict[int, list[int]]:
    """ppid -> pids over all of /proc: the fallback when the children files are missing."""
    table: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        fields = _fields_after_comm(int(entry)) if entry.isdigit() else None
        if fields and len(fields) > 1:
            table.setdefault(int(fields[1]), []).append(int(entry))
    return table


def alive_descendants(root: int) -> list[int]:
    """Every live descendant of root: one with any thread that has not exited (a process whose
    leader thread left while others run is alive, though /proc/PID says Z).

    As a subreaper the launcher adopts orphans, so this includes workers that setsid()'d away.
    The per-task children files only touch our own tree (fast); without CONFIG_PROC_CHILDREN
    it falls back to a ppid walk over all of /proc.
    """
    table = None if os.path.exists(f"/proc/{root}/task/{root}/children") else _scan_children()
    found: list[int] = []
    seen = {root}
    stack = [root]
    while stack:
        parent = stack.pop()
        kids = _children(parent) if table is None else table.get(parent, [])
        for pid in kids:
            if pid in seen:
                continue
            seen.add(pid)
            stack.append(pid)
            if live_thread(pid) is not None:
                found.append(pid)
    return found


def catches(pid: int, signum: int) -> bool:
    """Whether pid has a handler installed for signum (SigCgt in /proc/PID/status). Such a process
    asked for the signal; any other would die of it (SIGUSR1's default action) or ignore it."""
    data = read_bytes(f"/proc/{pid}/status")
    for line in (data or b"").splitlines():
        if line.startswith(b"SigCgt:"):
            try:
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
            except (IndexError, ValueError):
                return False
    return False


def command_problem(command: list[str]) -> str | None:
    """Why the trainer command could not be started, found as the spawn would look for it (this
    process's PATH, which the trainer inherits); None when it can. Told before the go-ahead, so a
    command that cannot run uses no deadline record and no attempt."""
    program = command[0] if command else ""
    if os.sep in program:
        if not os.path.isfile(program):
            return "was not found"
        return None if os.access(program, os.X_OK) else "is not executable"
    return None if program and shutil.which(program) else "was not found"


def set_child_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(err)}")


def refuse_tracers() -> bool:
    """Make this process non-dumpable: a process of the same UID without CAP_SYS_PTRACE can then no
    longer ptrace it (nor read its fds or memory through /proc). The trainer runs under the
    launcher's UID, and a tracer could make the launcher clone a process outside its own tree.
    Its children are dumpable again once they exec. False when the kernel refused."""
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
