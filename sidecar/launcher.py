#!/usr/bin/env python3
"""soak launcher: runs the trainer for soak-sidecar inside the trainer's own container.

Python standard library only, Python 3.9+, usable as one copied file::

    python3 launcher.py --run-dir /soak/run -- python train.py --epochs 3

It becomes a child subreaper, announces itself in the run dir, waits for the sidecar's go.json
(or abort.json), starts the trainer in a new session, tees its output to a bounded console log
and (from a writer thread, dropping what a slow reader cannot take) to its own stdout,
forwards signals to the trainer's process group, enforces the deadline on its own clock as a
fail-safe, kills the trainer when the sidecar's heartbeat goes stale, acts on control.json, and
on exit kills and reaps every descendant (adopted orphans included) and writes exit.json.
The protocol is documented in docs/run-dir-protocol.md; the sidecar imports the names below.
It must never import anything from ``sidecar.*``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import select
import selectors
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
import uuid
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

PROTOCOL = 1
# The oldest Python a trainer image may bring to run this file (tested in CI under exactly this).
MIN_PYTHON = (3, 9)

LAUNCHER_FILE = "launcher.json"
GO_FILE = "go.json"
ABORT_FILE = "abort.json"
HEARTBEAT_FILE = "sidecar.heartbeat"
CONTROL_FILE = "control.json"
SOFT_STOP_FILE = "soft-stop.json"
TRAINER_FILE = "trainer.json"
EXIT_FILE = "exit.json"
# The trainer-side agent's report of its tree's fd tables, for a sidecar under another UID.
FD_REPORT_FILE = "fds.json"
DEADLINE_COPY_FILE = "deadline.json"
CONSOLE_LOG = "console.log"
CONSOLE_LOG_ROTATED = "console.log.1"
# Every file the protocol defines, in the order a fresh run creates them (reset() removes these).
RUN_DIR_FILES = (
    LAUNCHER_FILE,
    GO_FILE,
    ABORT_FILE,
    HEARTBEAT_FILE,
    CONTROL_FILE,
    DEADLINE_COPY_FILE,
    TRAINER_FILE,
    SOFT_STOP_FILE,
    CONSOLE_LOG,
    CONSOLE_LOG_ROTATED,
    EXIT_FILE,
    FD_REPORT_FILE,
)

ACTIONS = ("soft_stop", "terminate", "kill")
REASONS = (
    "exited",
    "deadline",
    "heartbeat_lost",
    "owner_lost",
    "control",
    "signalled",
    "aborted",
    "go_timeout",
    "insufficient_budget",
    "spawn_failed",
    "protocol_error",
    "subreaper_unavailable",
    "launcher_error",
)
FORWARDED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")

# Environment the trainer sees (the launcher sets the path variables from its own --run-dir so a
# different mount point in the trainer container cannot point them elsewhere).
ENV_RUN_DIR = "SOAK_RUN_DIR"
ENV_RUN_ID = "SOAK_RUN_ID"
ENV_DEADLINE_FILE = "SOAK_DEADLINE_FILE"
ENV_SOFT_STOP_FILE = "SOAK_SOFT_STOP_FILE"
# The trainer's GPU selection, reported in launcher.json: a sidecar under another UID cannot read
# the trainer's /proc/<pid>/environ, and the trainer inherits the launcher's environment.
GPU_ENV_VARS = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
# Bounds of fd reporting: never more often than this, and at most this many processes per report.
MIN_FD_REPORT_S = 0.01
FD_REPORT_MAX_PROCESSES = 20_000
FD_REPORT_LIMIT_BYTES = 8 * 1024 * 1024

# Launcher exit codes besides the trainer's own (0-255, 128+N when the trainer died of signal N).
EXIT_USAGE = 64  # bad command line
EXIT_PROTOCOL = 65  # go.json present but malformed (EX_DATAERR)
EXIT_LAUNCHER_ERROR = 70  # a bug in the launcher (EX_SOFTWARE); the trainer was killed
EXIT_SUBREAPER = 71  # PR_SET_CHILD_SUBREAPER unavailable (EX_OSERR)
EXIT_GO_TIMEOUT = 75  # no go.json/abort.json within --go-timeout (EX_TEMPFAIL)
EXIT_INSUFFICIENT_BUDGET = 18  # less than the checkpoint margin left at go (sidecar's code too)
EXIT_ABORT_DEFAULT = 15  # abort.json without a usable exit_code (the sidecar's REFUSED)
EXIT_SUPERVISOR_LOST = 125  # heartbeat stale or --owner-pid lost (the seed's supervisor_lost)
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127

DEFAULT_GO_TIMEOUT_S = 300.0
DEFAULT_KILL_GRACE_S = 5.0
DEFAULT_CONSOLE_LOG_BYTES = 64 * 1024 * 1024
# A run-dir record (JSON) is a few KiB; a longer file is not one.
RECORD_LIMIT_BYTES = 1024 * 1024
# Fallback re-read of control/heartbeat files when inotify misses or is unavailable.
FALLBACK_POLL_S = 0.5
# After SIGKILL, how long to wait for the kernel to let processes die before giving up on reaping.
REAP_LIMIT_S = 10.0
# Trainer output waiting for a slow stdout reader; beyond this it is dropped from stdout (never
# from console.log) and counted in exit.json's stdout_dropped_bytes.
STDOUT_QUEUE_BYTES = 1 << 20
# The launcher's own messages waiting for a slow stderr reader; beyond this they are dropped.
STDERR_QUEUE_BYTES = 256 * 1024
# At most one "N bytes of trainer output not shown" note on stderr per this many seconds.
DROP_NOTE_INTERVAL_S = 5.0
# At exit, how long the writer threads get to flush what is queued (exit never waits longer).
STDOUT_FLUSH_S = 1.0
STDERR_FLUSH_S = 0.5

PR_SET_CHILD_SUBREAPER = 36
_IN_CLOSE_WRITE = 0x8
_IN_MOVED_TO = 0x80
_INOTIFY_HEADER = struct.Struct("iIII")


# The writer threads' largest write: atomic on a pipe (all or nothing), see FdWriter.
_WRITE_SLICE = select.PIPE_BUF


class FdWriter:
    """Writes chunks to an fd from a daemon thread, so the caller never blocks on a slow reader.

    The launcher's stdout and stderr may be a pipe nobody drains (``| less`` left alone, a stuck
    reader) or a terminal stopped with Ctrl-S: a write there can block for ever, and the event loop
    must not. ``put`` only queues (or, past ``limit_bytes``, drops and counts); the thread does the
    blocking writes. O_NONBLOCK is never set on the fd: its file description may be a terminal
    shared with other processes. After a write error (EPIPE: the reader is gone) it stays off.

    The thread writes at most PIPE_BUF bytes at a time: such a write to a pipe is atomic, so a
    write still blocked at close() has put nothing into the pipe and ``dropped_bytes`` is exact
    (should the reader resume before the process exits, that one slice may still land).
    """

    def __init__(self, fd: int, limit_bytes: int) -> None:
        self.fd = fd
        self.limit_bytes = limit_bytes
        self.dropped_bytes = 0  # put() while over the limit, or still queued at close()
        self.error: OSError | None = None
        self._cond = threading.Condition()
        self._chunks: deque[bytes] = deque()
        self._queued = 0  # bytes in _chunks plus the unwritten rest of the chunk being written
        self._closed = False
        self._thread: threading.Thread | None = None

    def put(self, data: bytes) -> None:
        if not data:
            return
        with self._cond:
            if self._closed or self.error is not None:
                return
            if self._queued + len(data) > self.limit_bytes:
                self.dropped_bytes += len(data)
                return
            if self._thread is None:
                thread = threading.Thread(target=self._run, name=f"fd{self.fd}-writer", daemon=True)
                try:
                    thread.start()
                except RuntimeError as exc:  # cannot start a thread: give up on this fd
                    self.error = OSError(f"cannot start the writer thread: {exc}")
                    return
                self._thread = thread
            self._chunks.append(data)
            self._queued += len(data)
            self._cond.notify_all()

    def queued(self) -> int:
        with self._cond:
            return self._queued

    def flush(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for the queue to be written; True when it was (or the fd failed)."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while self._queued and self.error is None:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self, timeout_s: float) -> None:
        """Flush for at most timeout_s, then count whatever is still queued as dropped."""
        self.flush(timeout_s)
        with self._cond:
            if not self._closed and self.error is None:
                self.dropped_bytes += self._queued
            self._closed = True
            self._chunks.clear()
            self._cond.notify_all()

    def _run(self) -> None:
        # Signals go to the main thread, whose event loop handles them (set_wakeup_fd).
        with contextlib.suppress(AttributeError, OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        while True:
            with self._cond:
                while not self._chunks and not self._closed:
                    self._cond.wait()
                if not self._chunks:
                    return
                view = memoryview(self._chunks.popleft())
            try:
                while view:
                    with self._cond:
                        if self._closed:  # the rest was counted as dropped
                            return
                    written = os.write(self.fd, view[:_WRITE_SLICE])
                    view = view[written:]
                    with self._cond:
                        self._queued -= written
                        if not view:
                            self._cond.notify_all()
            except OSError as exc:
                with self._cond:
                    self.error = exc
                    self._chunks.clear()
                    self._queued = 0
                    self._cond.notify_all()
                return


# The launcher's messages: never a blocking write from the event loop (stderr may be stalled too).
_STDERR = FdWriter(2, STDERR_QUEUE_BYTES)


def log(message: str) -> None:
    _STDERR.put(f"[soak-launcher] {message}\n".encode(errors="replace"))


# ----------------------------------------------------------------------------- files


def atomic_write_json(path: str, payload: Mapping[str, Any], *, durable: bool = True) -> None:
    """Write JSON via temp file + rename so readers never see a partial file; fsync when durable."""
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
    data = (json.dumps(dict(payload), sort_keys=True) + "\n").encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def read_json(path: str, limit: int = RECORD_LIMIT_BYTES) -> dict[str, Any] | None:
    """The JSON object at path, or None when missing or not (yet) a valid object."""
    data = read_bytes(path, limit)
    if data is None:
        return None
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def read_bytes(path: str, limit: int = RECORD_LIMIT_BYTES) -> bytes | None:
    """A run-dir file as the other side wrote it, or None. The trainer can write the run dir too: no
    symlink is followed, a FIFO or device is never waited on, only a regular file is read, and at
    most ``limit`` bytes of it (a longer one is not a record)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks) if size <= limit else None
    except OSError:
        return None
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- /proc


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the comm, starting with the state (field 3)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode(errors="replace")
    except OSError:
        return None
    return raw.rpartition(")")[2].split()


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: start time in clock ticks since boot (PID-reuse guard)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def boot_id() -> str | None:
    data = read_bytes("/proc/sys/kernel/random/boot_id")
    return data.decode().strip() if data else None


def command_of(pid: int) -> str:
    data = read_bytes(f"/proc/{pid}/cmdline")
    if data:
        parts = data.rstrip(b"\0").split(b"\0")
        return " ".join(part.decode(errors="replace") for part in parts)[:512]
    comm = read_bytes(f"/proc/{pid}/comm")
    return f"[{comm.decode(errors='replace').strip()}]" if comm else "?"


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
        fields = _stat_fields(int(entry)) if entry.isdigit() else None
        if fields and len(fields) > 1:
            table.setdefault(int(fields[1]), []).append(int(entry))
    return table


def alive_descendants(root: int) -> list[int]:
    """Every live (non-zombie) descendant of root.

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
            fields = _stat_fields(pid)
            if fields and fields[0] not in ("Z", "X"):
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


def signal_number(name: str) -> int:
    """SIGUSR1 / USR1 / 10 -> 10; ValueError for anything else."""
    text = name.strip().upper()
    if text.isdigit():
        return int(signal.Signals(int(text)))
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return int(signal.Signals[text])
    except KeyError:
        raise ValueError(f"unknown signal {name!r}") from None


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


class _DirWatch:
    """inotify on the run dir so go/control/heartbeat changes wake the loop at once."""

    def __init__(self, directory: str) -> None:
        self.fd: int | None = None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                return
            mask = _IN_CLOSE_WRITE | _IN_MOVED_TO
            if libc.inotify_add_watch(fd, os.fsencode(directory), mask) < 0:
                os.close(fd)
                return
            self.fd = fd
        except (OSError, AttributeError):
            self.fd = None

    def drain(self) -> set[str]:
        names: set[str] = set()
        if self.fd is None:
            return names
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return names
            except OSError:
                return names
            offset = 0
            while offset + _INOTIFY_HEADER.size <= len(buf):
                _wd, _mask, _cookie, length = _INOTIFY_HEADER.unpack_from(buf, offset)
                start = offset + _INOTIFY_HEADER.size
                names.add(buf[start : start + length].rstrip(b"\0").decode(errors="replace"))
                offset = start + length

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class ConsoleLog:
    """console.log + console.log.1, each at most half the cap, so both stay within it."""

    def __init__(self, path: str, cap_bytes: int) -> None:
        self.path = path
        self.half = max(1, cap_bytes // 2)
        self.size = 0
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            room = self.half - self.size
            if room <= 0:
                self._rotate()
                continue
            part = view[:room]
            _write_all(self.fd, part)
            self.size += len(part)
            view = view[len(part) :]

    def _rotate(self) -> None:
        os.close(self.fd)
        os.replace(self.path, self.path + ".1")
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self.size = 0

    def close(self) -> None:
        os.close(self.fd)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class DeadlineClock:
    """The seed's Deadline: remaining = min(wall remaining, monotonic remaining).

    The monotonic end is fixed when the launcher learns the deadline, so setting the wall clock
    back cannot extend it; a wall clock jumping forward shortens it (never extends).
    """

    def __init__(
        self,
        deadline_unix: float,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.deadline_unix = deadline_unix
        self._wall = wall
        self._monotonic = monotonic
        self.monotonic_end = monotonic() + (deadline_unix - wall())

    def remaining(self) -> float:
        return min(self.deadline_unix - self._wall(), self.monotonic_end - self._monotonic())


GO_NUMBERS = (
    "deadline_unix",
    "checkpoint_margin_s",
    "term_grace_s",
    "heartbeat_timeout_s",
    "kill_grace_s",
    "stop_grace_s",
)
# Stop signals from outside (the kubelet deleting the pod, kill, Ctrl-C): with go.json's
# stop_grace_s > 0 they become the soft stop first and reach the trainer only after that grace.
STOP_SIGNALS = ("SIGTERM", "SIGINT")


def _require_finite(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"go.json: {key} must be a finite number")


@dataclass(frozen=True)
class GoRequest:
    """go.json, the sidecar's go-ahead. The one definition of the record: the sidecar builds one and
    writes ``to_json()``; the launcher starts the trainer only on what ``from_json()`` accepts."""

    launch_id: str
    deadline_unix: float
    checkpoint_margin_s: float
    term_grace_s: float
    heartbeat_timeout_s: float
    kill_grace_s: float = DEFAULT_KILL_GRACE_S
    console_log_bytes: int = DEFAULT_CONSOLE_LOG_BYTES
    soft_stop_signal: str = "SIGUSR1"
    env: Mapping[str, str] = field(default_factory=dict)
    # Appended to the trainer's argv: the seed's approved `--resume <checkpoint>`.
    extra_args: tuple[str, ...] = ()
    # Seconds between fd reports (fds.json); None when the sidecar reads the fd tables itself.
    fd_report_s: float | None = None
    # A stop signal from outside: seconds between the soft stop and forwarding it (0: at once).
    stop_grace_s: float = 0.0

    def __post_init__(self) -> None:
        for key in GO_NUMBERS:
            _require_finite(key, getattr(self, key))
        if self.checkpoint_margin_s <= 0 or min(self.term_grace_s, self.kill_grace_s, self.stop_grace_s) < 0:
            raise ValueError(
                "go.json: need margin > 0, term_grace_s >= 0, kill_grace_s >= 0, stop_grace_s >= 0"
            )
        if self.heartbeat_timeout_s <= 0:
            raise ValueError("go.json: heartbeat_timeout_s must be > 0")
        cap = self.console_log_bytes
        if isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0:
            raise ValueError("go.json: console_log_bytes must be a positive integer")
        signal_number(self.soft_stop_signal)
        if not isinstance(self.env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            raise ValueError("go.json: env must map strings to strings")
        if not all(isinstance(arg, str) for arg in self.extra_args):
            raise ValueError("go.json: extra_args must be a list of strings")
        if self.fd_report_s is not None:
            _require_finite("fd_report_s", self.fd_report_s)
            if self.fd_report_s < MIN_FD_REPORT_S:
                raise ValueError(f"go.json: fd_report_s must be >= {MIN_FD_REPORT_S}")

    @property
    def soft_stop_signum(self) -> int:
        return signal_number(self.soft_stop_signal)

    @property
    def soft_stop_unix(self) -> float:
        return self.deadline_unix - self.checkpoint_margin_s

    @property
    def term_unix(self) -> float:
        return self.deadline_unix - self.term_grace_s

    def trainer_env(self) -> dict[str, str]:
        """What the trainer's environment gains: its deadline figures, then the sidecar's ``env``."""
        return {
            "SOAK_DEADLINE_UNIX": repr(self.deadline_unix),
            "SOAK_SOFT_STOP_UNIX": repr(self.soft_stop_unix),
            "SOAK_TERM_UNIX": repr(self.term_unix),
            "SOAK_CHECKPOINT_MARGIN_S": repr(self.checkpoint_margin_s),
            "SOAK_SOFT_STOP_SIGNAL": self.soft_stop_signal,
            **self.env,
        }

    def deadline_copy(self, record: Mapping[str, Any] | None) -> dict[str, Any]:
        """deadline.json, the trainer's copy of its deadline, written by the sidecar with go.json."""
        return {
            "protocol": PROTOCOL,
            "deadline_unix": self.deadline_unix,
            "soft_stop_unix": self.soft_stop_unix,
            "term_unix": self.term_unix,
            "checkpoint_margin_s": self.checkpoint_margin_s,
            "term_grace_s": self.term_grace_s,
            "soft_stop_signal": self.soft_stop_signal,
            "run_id": self.env.get(ENV_RUN_ID),
            "record": None if record is None else dict(record),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            **{name: getattr(self, name) for name in self.__dataclass_fields__},
            "env": dict(self.env),
            "extra_args": list(self.extra_args),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> GoRequest:
        extra_args = raw.get("extra_args", [])
        if not isinstance(extra_args, list):
            raise ValueError("go.json: extra_args must be a list of strings")
        return cls(
            launch_id=str(raw.get("launch_id")),
            deadline_unix=raw.get("deadline_unix", math.nan),  # a missing number fails __post_init__
            checkpoint_margin_s=raw.get("checkpoint_margin_s", math.nan),
            term_grace_s=raw.get("term_grace_s", math.nan),
            heartbeat_timeout_s=raw.get("heartbeat_timeout_s", math.nan),
            kill_grace_s=raw.get("kill_grace_s", DEFAULT_KILL_GRACE_S),
            console_log_bytes=raw.get("console_log_bytes", DEFAULT_CONSOLE_LOG_BYTES),
            soft_stop_signal=str(raw.get("soft_stop_signal", "SIGUSR1")),
            env=raw.get("env", {}),
            extra_args=tuple(extra_args),
            fd_report_s=raw.get("fd_report_s"),
            stop_grace_s=raw.get("stop_grace_s", 0.0),
        )


# ----------------------------------------------------------------------------- fd tables

# Prefix rules of the seed's ``_fd_class`` plus "/memfd:", which is how Linux actually names a
# memfd target ("/memfd:<name> (deleted)"; the seed's "memfd:" never matches, so the seed counts
# memfds as "other"). The prefixes are mutually exclusive, so first-match order does not matter.
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

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def fd_class(link: str) -> str:
    """Class of one fd from its readlink target (the seed's rules, plus "/memfd:")."""
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
        dir_fd = os.open("fd", _DIR_FLAGS, dir_fd=pid_fd)
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
        try:
            pid_fd = os.open(f"/proc/{pid}", _DIR_FLAGS)
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
        dir_fd = os.open("fd", _DIR_FLAGS, dir_fd=pid_fd)
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


# ----------------------------------------------------------------------------- launcher


class _ExitRequestError(Exception):
    """Leave the launcher with this code after exit.json is written."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Launcher:
    def __init__(
        self,
        run_dir: str,
        command: list[str],
        *,
        go_timeout_s: float = DEFAULT_GO_TIMEOUT_S,
        owner_pid: int | None = None,
        subreaper: bool = True,
        termination_log: str | None = None,
    ) -> None:
        self.run_dir = os.path.abspath(run_dir)
        self.command = command
        self.go_timeout_s = go_timeout_s
        self.owner_pid = owner_pid
        self.subreaper = subreaper
        self.termination_log = termination_log
        self.launch_id = uuid.uuid4().hex
        self.pid = os.getpid()

        self.go: GoRequest | None = None
        self.clock: DeadlineClock | None = None
        self.trainer: subprocess.Popen[bytes] | None = None
        self.trainer_status: int | None = None
        self.trainer_started_unix: float | None = None
        self.console: ConsoleLog | None = None
        self.pipe_fd: int | None = None
        # Trainer output to our stdout, never blocking the event loop (see FdWriter).
        self.tee = FdWriter(1, STDOUT_QUEUE_BYTES)
        self._dropped_noted, self._drop_noted_at = 0, -math.inf
        self._tee_error_noted = False

        self.reason: str | None = None
        self.abort_exit_code: int | None = None
        self.deadline_expired = False
        self.heartbeat_lost = False
        self.owner_lost = False
        self.soft_stop_sent = False
        self.soft_stop_reason: str | None = None
        # When the soft stop, the first TERM and the first KILL went to the tree (wall clock).
        self.stop_times: dict[str, float] = {}
        self.term_sent = False
        self.kill_sent = False
        self.control_actions: list[dict[str, Any]] = []
        self.signals_forwarded: list[str] = []
        # Stop signals turned into the soft stop, and when they are forwarded after all.
        self.signals_deferred: list[str] = []
        self.forward_stop_at: float | None = None
        self.soft_stop_signalled: list[int] = []
        self.killed_with_trainer: dict[int, str] = {}
        self.survivors_killed: dict[int, str] = {}
        self.unreaped: list[int] = []
        self.escalate_at: float | None = None
        self.killed_at: float | None = None
        self.control_seq = -1
        self.hb_content: bytes | None = None
        self.hb_changed_at = 0.0
        self.last_fallback = 0.0
        self.next_fd_report: float | None = None
        self.fd_reporter = FdReporter()

        self._pending: list[int] = []
        self._owner_fd: int | None = None
        self._owner_gone = False
        self._dirty: set[str] = set()
        self.sel = selectors.DefaultSelector()
        self.watch = _DirWatch(self.run_dir)

    # -- plumbing -------------------------------------------------------------

    def path(self, name: str) -> str:
        return os.path.join(self.run_dir, name)

    def _install_signals(self) -> None:
        read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_r, self._wake_w = read_fd, write_fd
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

        def record(signum: int, _frame: object) -> None:
            self._pending.append(signum)

        signal.signal(signal.SIGCHLD, record)
        for name in FORWARDED_SIGNALS:
            signal.signal(signal.Signals[name], record)
        self.sel.register(read_fd, selectors.EVENT_READ, self._drain_wakeup)
        if self.watch.fd is not None:
            self.sel.register(self.watch.fd, selectors.EVENT_READ, self._on_watch)
        if self.owner_pid is not None:
            try:
                self._owner_fd = os.pidfd_open(self.owner_pid)
                self.sel.register(self._owner_fd, selectors.EVENT_READ, self._on_owner_exit)
            except (OSError, AttributeError):
                self._owner_fd = None  # fall back to the getppid() check on every wake-up

    def _drain_wakeup(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self._wake_r, 4096):
                pass

    def _on_watch(self) -> None:
        self._dirty |= self.watch.drain()

    def _on_owner_exit(self) -> None:
        self._owner_gone = True
        if self._owner_fd is not None:
            self.sel.unregister(self._owner_fd)
            os.close(self._owner_fd)
            self._owner_fd = None

    def _on_output(self) -> None:
        assert self.pipe_fd is not None
        try:
            data = os.read(self.pipe_fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(self.pipe_fd)
            os.close(self.pipe_fd)
            self.pipe_fd = None
            return
        if self.console is not None:
            try:
                self.console.write(data)
            except OSError as exc:
                log(f"console log write failed, log disabled: {exc}")
                self.console = None
        self.tee.put(data)

    def note_tee(self, *, final: bool = False) -> None:
        """Say on stderr (at most every DROP_NOTE_INTERVAL_S) how much output stdout missed."""
        if self.tee.error is not None and not self._tee_error_noted:
            self._tee_error_noted = True
            log(f"stdout write failed ({self.tee.error}); trainer output goes to {CONSOLE_LOG} only")
        new = self.tee.dropped_bytes - self._dropped_noted
        now = time.monotonic()
        if new > 0 and (final or now - self._drop_noted_at >= DROP_NOTE_INTERVAL_S):
            self._dropped_noted += new
            self._drop_noted_at = now
            log(f"{new} bytes of trainer output not shown (stdout reader too slow)")

    def close_tee(self) -> None:
        """Give the stdout writer a bounded time to flush; what it could not write is dropped."""
        self.tee.close(STDOUT_FLUSH_S)
        self.note_tee(final=True)

    def wait(self, timeout: float | None) -> list[int]:
        """One event-loop turn: wait for fds or the timeout, reap children, return signals seen."""
        for key, _mask in self.sel.select(None if timeout is None else max(0.0, timeout)):
            key.data()
        self.reap()
        self.note_tee()
        pending, self._pending = self._pending, []
        return [s for s in pending if s != signal.SIGCHLD]

    def reap(self) -> bool:
        """waitpid(-1) until nothing is left to reap: the trainer, its children, adopted orphans.

        True when the launcher has no children left at all.
        """
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return False
            if self.trainer is not None and pid == self.trainer.pid:
                self.trainer_status = status
                self.trainer.returncode = os.waitstatus_to_exitcode(status)

    def owner_lost_now(self) -> bool:
        if self.owner_pid is None:
            return False
        return self._owner_gone or os.getppid() != self.owner_pid

    # -- protocol -------------------------------------------------------------

    def announce(self) -> None:
        atomic_write_json(
            self.path(LAUNCHER_FILE),
            {
                "protocol": PROTOCOL,
                "launch_id": self.launch_id,
                "pid": self.pid,
                "start_ticks": start_ticks(self.pid),
                "boot_id": boot_id(),
                "hostname": socket.gethostname(),
                "command": self.command,
                "command_problem": command_problem(self.command),
                "python": sys.executable,
                "python_version": ".".join(str(v) for v in sys.version_info[:3]),
                "subreaper": self.subreaper,
                "owner_pid": self.owner_pid,
                "go_timeout_s": self.go_timeout_s,
                "started_unix": time.time(),
                "gpu_env": {name: os.environ[name] for name in GPU_ENV_VARS if name in os.environ},
            },
        )

    def _bound(self, raw: Mapping[str, Any] | None, *, allow_unbound: bool = False) -> bool:
        """A request counts only when it names this launcher (never a stale file of another)."""
        if raw is None or raw.get("protocol") != PROTOCOL:
            return False
        bound = raw.get("launch_id")
        return bound == self.launch_id or (allow_unbound and bound is None)

    def wait_for_go(self) -> GoRequest:
        end = time.monotonic() + self.go_timeout_s
        while True:
            if self.owner_lost_now():
                log("owner process lost before launch; not starting the trainer")
                self.owner_lost = True
                self.reason = "owner_lost"
                raise _ExitRequestError(EXIT_SUPERVISOR_LOST)
            abort = read_json(self.path(ABORT_FILE))
            if self._bound(abort, allow_unbound=True):
                assert abort is not None
                code = abort.get("exit_code")
                self.abort_exit_code = EXIT_ABORT_DEFAULT
                if isinstance(code, int) and not isinstance(code, bool) and 1 <= code <= 255:
                    self.abort_exit_code = code
                self.reason = "aborted"
                log(f"aborted by the sidecar: {abort.get('reason')}")
                raise _ExitRequestError(self.abort_exit_code)
            go = read_json(self.path(GO_FILE))
            if self._bound(go):
                assert go is not None
                try:
                    return GoRequest.from_json(go)
                except ValueError as exc:
                    log(str(exc))
                    self.reason = "protocol_error"
                    raise _ExitRequestError(EXIT_PROTOCOL) from exc
            left = end - time.monotonic()
            if left <= 0:
                log(f"no go.json within {self.go_timeout_s:g}s")
                self.reason = "go_timeout"
                raise _ExitRequestError(EXIT_GO_TIMEOUT)
            step = 1.0 if self.watch.fd is not None else 0.1
            for signum in self.wait(min(left, step)):
                if signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    log(f"{signal_name(signum)} before the trainer started")
                    self.reason = "signalled"
                    raise _ExitRequestError(128 + signum)

    def start_trainer(self, go: GoRequest) -> None:
        self.go = go
        self.clock = DeadlineClock(go.deadline_unix)
        if self.clock.remaining() <= go.checkpoint_margin_s:
            # The seed's rule: never start (or resume) inside the checkpoint margin.
            log("less than the checkpoint margin left; not starting the trainer")
            self.reason = "insufficient_budget"
            raise _ExitRequestError(EXIT_INSUFFICIENT_BUDGET)
        if self.owner_lost_now():
            self.owner_lost = True
            self.reason = "owner_lost"
            raise _ExitRequestError(EXIT_SUPERVISOR_LOST)
        env = dict(os.environ)
        env.update(go.trainer_env())
        env[ENV_RUN_DIR] = self.run_dir
        env[ENV_DEADLINE_FILE] = self.path(DEADLINE_COPY_FILE)
        env[ENV_SOFT_STOP_FILE] = self.path(SOFT_STOP_FILE)
        self.console = ConsoleLog(self.path(CONSOLE_LOG), go.console_log_bytes)
        try:
            self.trainer = subprocess.Popen(
                [*self.command, *go.extra_args],
                start_new_session=True,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        except OSError as exc:
            log(f"cannot start {self.command[0]!r}: {exc}")
            self.reason = "spawn_failed"
            missing = isinstance(exc, FileNotFoundError)
            raise _ExitRequestError(EXIT_NOT_FOUND if missing else EXIT_NOT_EXECUTABLE) from exc
        self.trainer_started_unix = time.time()
        assert self.trainer.stdout is not None
        self.pipe_fd = os.dup(self.trainer.stdout.fileno())
        self.trainer.stdout.close()
        os.set_blocking(self.pipe_fd, False)
        self.sel.register(self.pipe_fd, selectors.EVENT_READ, self._on_output)
        self.hb_content = read_bytes(self.path(HEARTBEAT_FILE))
        self.hb_changed_at = time.monotonic()
        atomic_write_json(
            self.path(TRAINER_FILE),
            {
                "protocol": PROTOCOL,
                "launch_id": self.launch_id,
                "pid": self.trainer.pid,
                "pgid": self.trainer.pid,
                "start_ticks": start_ticks(self.trainer.pid),
                "started_unix": self.trainer_started_unix,
            },
        )

    # -- stopping -------------------------------------------------------------

    def _signal_group(self, signum: int) -> None:
        if self.trainer is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.trainer.pid, signum)

    def _signal_tree(self, signum: int, *, only_catchers: bool = False) -> list[int]:
        """signum to every live process of the trainer's tree, whatever its session or group (a
        worker that setsid()'d away is still the subreaper's descendant), and to the trainer's
        group; with only_catchers, only to the processes with a handler for it. The PIDs signalled."""
        group = None
        if not only_catchers and self.trainer is not None:
            group = self.trainer.pid
            self._signal_group(signum)
        sent: list[int] = []
        for pid in alive_descendants(self.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                # Once is enough: the group's members had it from killpg.
                if (only_catchers and not catches(pid, signum)) or os.getpgid(pid) == group:
                    continue
                os.kill(pid, signum)
                sent.append(pid)
        return sent

    def kill_everything(self, into: dict[int, str]) -> None:
        """SIGKILL the trainer's group and every live descendant, recording them in ``into``.

        One pass, no spinning while the victims die (they need the CPU to exit): callers repeat
        it on every wake-up until nothing is left, which also catches a child forked between
        the scan and the kill (it reparents to us, the subreaper).
        """
        self.kill_sent = True
        self.stop_times.setdefault("kill", time.time())
        victims = alive_descendants(self.pid)
        known = self.killed_with_trainer.keys() | self.survivors_killed.keys()
        for pid in victims:
            if pid not in known and (self.trainer is None or pid != self.trainer.pid):
                into[pid] = command_of(pid)
        self._signal_group(signal.SIGKILL)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def stop(self, reason: str, *, hard: bool) -> None:
        if self.reason is None:
            self.reason = reason
        if hard:
            self.kill_everything(self.killed_with_trainer)
        else:
            self.term_sent = True
            self.stop_times.setdefault("term", time.time())
            self._signal_tree(signal.SIGTERM)
            if self.escalate_at is None:
                self.escalate_at = time.monotonic() + (self.go.kill_grace_s if self.go else 0.0)

    def send_soft_stop(self, reason: str) -> None:
        if self.soft_stop_sent or self.go is None:
            return
        self.soft_stop_sent = True
        self.stop_times.setdefault("soft_stop", time.time())
        self.soft_stop_reason = reason
        atomic_write_json(
            self.path(SOFT_STOP_FILE),
            {
                "protocol": PROTOCOL,
                "launch_id": self.launch_id,
                "reason": reason,
                "deadline_unix": self.go.deadline_unix,
                "sent_unix": time.time(),
            },
        )
        # Only to processes that asked for it: torchrun's agent has no handler and would die of
        # SIGUSR1, while its workers (each in a session of its own) catch it and checkpoint.
        self.soft_stop_signalled = self._signal_tree(self.go.soft_stop_signum, only_catchers=True)

    def check_heartbeat(self) -> None:
        content = read_bytes(self.path(HEARTBEAT_FILE))
        if content is not None and content != self.hb_content:
            self.hb_content = content
            self.hb_changed_at = time.monotonic()

    def check_control(self) -> None:
        raw = read_json(self.path(CONTROL_FILE))
        if not self._bound(raw):
            return
        assert raw is not None
        seq, action = raw.get("seq"), raw.get("action")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq <= self.control_seq:
            return
        self.control_seq = seq
        if action not in ACTIONS:
            log(f"control.json: unknown action {action!r} ignored")
            return
        self.control_actions.append({"seq": seq, "action": action, "reason": raw.get("reason")})
        log(f"control: {action} ({raw.get('reason')})")
        if action == "soft_stop":
            self.send_soft_stop(f"control: {raw.get('reason')}")
        else:
            self.stop("control", hard=action == "kill")

    # -- the main loop ----------------------------------------------------------

    def supervise(self) -> None:
        """Run until the trainer is reaped, enforcing deadline, heartbeat, owner and control."""
        clock = self.clock
        assert self.go is not None and clock is not None and self.trainer is not None
        signals: list[int] = []
        while self.trainer_status is None:
            for signum in signals:
                self._on_signal(signum)
            now = time.monotonic()
            remaining = clock.remaining()
            self._enforce_kills(remaining, now)
            self._forward_deferred_stop(now)
            self._deadline_stops(remaining)
            self._read_changes(now)
            self._report_fds(now)
            timeout = self._wait_timeout(now)
            if timeout is None:
                return
            signals = self.wait(timeout)
            if self.kill_sent and self.trainer_status is None:
                self.kill_everything(self.killed_with_trainer)

    def _on_signal(self, signum: int) -> None:
        """Forward a signal to the trainer's tree; the first stop signal from outside becomes the soft
        stop instead, so the trainer can checkpoint (a second one, or the grace's end, forwards it)."""
        go = self.go
        assert go is not None
        name = signal_name(signum)
        if name in STOP_SIGNALS and go.stop_grace_s > 0 and self.forward_stop_at is None:
            log(f"{name}: soft stop first, the trainer gets {name} in {go.stop_grace_s:g}s")
            self.signals_deferred.append(name)
            self.forward_stop_at = time.monotonic() + go.stop_grace_s
            self.send_soft_stop(f"signal: {name}")
            return
        self.signals_forwarded.append(name)
        self._signal_tree(signum, only_catchers=signum in (signal.SIGUSR1, signal.SIGUSR2))

    def _forward_deferred_stop(self, now: float) -> None:
        go = self.go
        assert go is not None
        if self.forward_stop_at is None or now < self.forward_stop_at or self.term_sent or self.kill_sent:
            return
        name = self.signals_deferred[0]
        log(f"the trainer still runs {go.stop_grace_s:g}s after the soft stop: {name} to its tree")
        self.signals_forwarded.append(name)
        self.reason = self.reason or "signalled"
        self.term_sent = True
        self.stop_times.setdefault("term", time.time())
        self._signal_tree(signal_number(name))
        self.escalate_at = now + go.kill_grace_s

    def _enforce_kills(self, remaining: float, now: float) -> None:
        """KILL at the deadline, when the owner or its heartbeat is lost, and when TERM's grace is up."""
        go = self.go
        assert go is not None
        if remaining <= 0 and not self.deadline_expired:
            self.deadline_expired = True
            self.stop("deadline", hard=True)
        if self.owner_lost_now() and not self.owner_lost:
            log("owner process lost: killing the trainer")
            self.owner_lost = True
            self.stop("owner_lost", hard=True)
        if now - self.hb_changed_at >= go.heartbeat_timeout_s and not self.heartbeat_lost:
            self.check_heartbeat()
            if time.monotonic() - self.hb_changed_at >= go.heartbeat_timeout_s:
                log(f"no heartbeat for {go.heartbeat_timeout_s:g}s: killing the trainer")
                self.heartbeat_lost = True
                self.stop("heartbeat_lost", hard=True)
        if self.escalate_at is not None and now >= self.escalate_at and not self.kill_sent:
            self.kill_everything(self.killed_with_trainer)

    def _deadline_stops(self, remaining: float) -> None:
        """The soft stop at the checkpoint margin, then TERM at term_grace_s before the deadline."""
        go = self.go
        assert go is not None
        if remaining <= go.checkpoint_margin_s and not (self.soft_stop_sent or self.kill_sent):
            self.send_soft_stop("checkpoint_margin")
        if remaining <= go.term_grace_s and not (self.term_sent or self.kill_sent):
            # The deadline's TERM: the trainer stopping now stopped because of the deadline.
            self.reason = self.reason or "deadline"
            self.term_sent = True
            self.stop_times.setdefault("term", time.time())
            self._signal_tree(signal.SIGTERM)

    def _read_changes(self, now: float) -> None:
        """Heartbeat and control: when inotify reports a change, and on the fallback poll."""
        if HEARTBEAT_FILE in self._dirty:
            self.check_heartbeat()
        fallback_due = now - self.last_fallback >= FALLBACK_POLL_S
        if CONTROL_FILE in self._dirty or fallback_due:
            self.check_control()
        if fallback_due:
            self.check_heartbeat()
            self.last_fallback = now
        self._dirty.clear()

    def _wait_timeout(self, now: float) -> float | None:
        """How long to wait for the next event; None once a KILLed trainer outlives REAP_LIMIT_S."""
        if not self.kill_sent:
            assert self.clock is not None
            return self._next_timeout(self.clock.remaining(), time.monotonic())
        # SIGCHLD wakes us as victims die; the timeout re-scans for stragglers.
        if self.killed_at is None:
            self.killed_at = now
        elif now - self.killed_at > REAP_LIMIT_S:
            log("the trainer does not die after SIGKILL (uninterruptible sleep?)")
            return None
        return 0.05

    def _next_timeout(self, remaining: float, now: float) -> float:
        go = self.go
        assert go is not None
        due = [remaining, self.hb_changed_at + go.heartbeat_timeout_s - now]
        due.append(self.last_fallback + FALLBACK_POLL_S - now)
        if not self.soft_stop_sent:
            due.append(remaining - go.checkpoint_margin_s)
        if not self.term_sent:
            due.append(remaining - go.term_grace_s)
        if self.escalate_at is not None:
            due.append(self.escalate_at - now)
        if self.forward_stop_at is not None and not self.term_sent:
            due.append(self.forward_stop_at - now)
        if self.next_fd_report is not None:
            due.append(self.next_fd_report - now)
        return max(0.0, min(due))

    def _report_fds(self, now: float) -> None:
        """fds.json when due: the fd tables of the launcher's tree, which a sidecar under another
        UID cannot read (that takes the same UID or CAP_SYS_PTRACE)."""
        go = self.go
        if go is None or go.fd_report_s is None:
            return
        if self.next_fd_report is not None and now < self.next_fd_report:
            return
        self.next_fd_report = now + go.fd_report_s
        pids = [self.pid, *alive_descendants(self.pid)][:FD_REPORT_MAX_PROCESSES]
        report = {
            "protocol": PROTOCOL,
            "launch_id": self.launch_id,
            "written_unix": time.time(),
            "processes": self.fd_reporter.tables(pids),
        }
        try:
            atomic_write_json(self.path(FD_REPORT_FILE), report, durable=False)
        except OSError as exc:
            log(f"cannot write {FD_REPORT_FILE}: {exc}")

    def cleanup(self) -> None:
        """After the trainer: TERM survivors, KILL them after kill_grace_s (at once past the
        deadline or when the run was killed), reap everything."""
        survivors = alive_descendants(self.pid)
        if survivors and not self.kill_sent:
            self._term_survivors(survivors)
        if alive_descendants(self.pid):
            self.kill_everything(self.survivors_killed)
        end = time.monotonic() + REAP_LIMIT_S
        while not self.reap() and time.monotonic() < end:
            self.wait(0.05)
            if alive_descendants(self.pid):
                self.kill_everything(self.survivors_killed)
        self.unreaped = alive_descendants(self.pid)
        self._drain_output()

    def _term_survivors(self, survivors: list[int]) -> None:
        """TERM what outlived the trainer and wait kill_grace_s, never past the deadline, for it."""
        grace = self.go.kill_grace_s if self.go else DEFAULT_KILL_GRACE_S
        for pid in survivors:
            self.survivors_killed[pid] = command_of(pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        self._signal_group(signal.SIGTERM)
        end = time.monotonic() + grace
        while survivors:
            left = end - time.monotonic()
            if self.clock is not None and self.clock.remaining() <= 0:
                self.deadline_expired = True
                break
            if left <= 0:
                break
            if self.clock is not None:
                left = min(left, max(0.0, self.clock.remaining()))
            # SIGCHLD wakes us: adopted survivors are our children, others die with them.
            self.wait(min(left, 0.05))
            survivors = alive_descendants(self.pid)
            for pid in survivors:
                if pid not in self.survivors_killed:
                    self.survivors_killed[pid] = command_of(pid)

    def _drain_output(self) -> None:
        end = time.monotonic() + 1.0
        while self.pipe_fd is not None and time.monotonic() < end:
            self._on_output()
            if self.pipe_fd is not None:
                self.wait(0.05)

    # -- exit -----------------------------------------------------------------

    def exit_code(self) -> int:
        if self.reason in ("heartbeat_lost", "owner_lost"):
            return EXIT_SUPERVISOR_LOST
        if self.trainer_status is None:
            return EXIT_LAUNCHER_ERROR
        code = os.waitstatus_to_exitcode(self.trainer_status)
        return 128 - code if code < 0 else code

    def write_exit(self, code: int) -> None:
        status = self.trainer_status
        returncode = signum = None
        if status is not None:
            if os.WIFSIGNALED(status):
                signum = os.WTERMSIG(status)
            else:
                returncode = os.waitstatus_to_exitcode(status)
        record = {
            "protocol": PROTOCOL,
            "launch_id": self.launch_id,
            "exit_code": code,
            "returncode": returncode,
            "signal": signum,
            "signal_name": signal_name(signum) if signum is not None else None,
            "reason": self.reason or "exited",
            "trainer_pid": self.trainer.pid if self.trainer is not None else None,
            "deadline_expired": self.deadline_expired,
            "heartbeat_lost": self.heartbeat_lost,
            "owner_lost": self.owner_lost,
            "soft_stop_sent": self.soft_stop_sent,
            "soft_stop_reason": self.soft_stop_reason,
            "stop_times_unix": self.stop_times,
            "term_sent": self.term_sent,
            "kill_sent": self.kill_sent,
            "control": self.control_actions,
            "signals_forwarded": self.signals_forwarded,
            "signals_deferred": self.signals_deferred,
            "soft_stop_signalled": self.soft_stop_signalled,
            "killed_with_trainer": _process_list(self.killed_with_trainer),
            "survivors_killed": _process_list(self.survivors_killed),
            "unreaped": self.unreaped,
            "stdout_dropped_bytes": self.tee.dropped_bytes,
            "started_unix": self.trainer_started_unix,
            "ended_unix": time.time(),
        }
        try:
            atomic_write_json(self.path(EXIT_FILE), record)
        except OSError as exc:
            log(f"cannot write {EXIT_FILE}: {exc}")
        if self.termination_log is not None:
            write_termination_log(self.termination_log, record)

    def run(self) -> int:
        code = EXIT_LAUNCHER_ERROR
        try:
            self._install_signals()
            self.announce()
            self.start_trainer(self.wait_for_go())
            self.supervise()
            self.cleanup()
            code = self.exit_code()
        except _ExitRequestError as done:
            code = done.code
            self.cleanup()
        except Exception as exc:
            # Fail closed: whatever went wrong, nothing we started may outlive us.
            log(f"launcher error: {exc!r}")
            self.reason = self.reason or "launcher_error"
            with contextlib.suppress(Exception):
                self.kill_everything(self.killed_with_trainer)
                self.cleanup()
            code = EXIT_LAUNCHER_ERROR
        with contextlib.suppress(Exception):
            self.close_tee()
        self.write_exit(code)
        return code


def _process_list(found: Mapping[int, str]) -> list[dict[str, Any]]:
    return [{"pid": pid, "command": command} for pid, command in sorted(found.items())]


TERMINATION_MESSAGE_BYTES = 4096  # the kubelet's cap on a termination message


def write_termination_log(path: str, record: dict[str, Any]) -> None:
    """The exit record, condensed, as the trainer container's termination message: why the trainer
    ended is then in the pod status even when the sidecar died first (heartbeat loss)."""
    summary = {key: record.get(key) for key in ("reason", "exit_code", "returncode", "signal_name")}
    text = "soak-launcher: " + json.dumps(summary, sort_keys=True)
    try:
        with open(path, "w", encoding="utf-8") as out:
            out.write(text[:TERMINATION_MESSAGE_BYTES])
    except OSError as exc:
        log(f"cannot write the termination log {path}: {exc}")


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="launcher.py",
        description="Run a trainer under soak-sidecar supervision (see docs/run-dir-protocol.md).",
    )
    parser.add_argument("--run-dir", required=True, help="Run dir shared with the sidecar.")
    parser.add_argument(
        "--go-timeout",
        type=float,
        default=DEFAULT_GO_TIMEOUT_S,
        help=f"Seconds to wait for go.json (default {DEFAULT_GO_TIMEOUT_S:g}); "
        f"exit {EXIT_GO_TIMEOUT} on timeout.",
    )
    parser.add_argument(
        "--owner-pid",
        type=int,
        default=None,
        help="Local mode: kill the trainer as soon as the launcher's parent is no longer this PID.",
    )
    parser.add_argument(
        "--termination-log",
        default=None,
        help="Write the exit reason there too (a pod's terminationMessagePath, /dev/termination-log).",
    )
    # Test-only: proves the orphan test can fail. Never use it in a real run.
    parser.add_argument("--no-subreaper", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("missing trainer command after --")
    if not args.go_timeout > 0:
        parser.error("--go-timeout must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    finally:
        # Our messages get a bounded time to reach stderr; a stalled stderr never holds up exit.
        _STDERR.flush(STDERR_FLUSH_S)


def _main(argv: list[str] | None) -> int:
    try:
        args = _parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) and exc.code != 2 else EXIT_USAGE
    run_dir = os.path.abspath(args.run_dir)
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as exc:
        log(f"cannot create the run dir: {exc}")
        return EXIT_USAGE
    if not args.no_subreaper:
        try:
            set_child_subreaper()
        except OSError as exc:
            log(str(exc))
            atomic_write_json(
                os.path.join(run_dir, EXIT_FILE),
                {
                    "protocol": PROTOCOL,
                    "launch_id": None,
                    "exit_code": EXIT_SUBREAPER,
                    "reason": "subreaper_unavailable",
                    "ended_unix": time.time(),
                },
            )
            return EXIT_SUBREAPER
    launcher = Launcher(
        run_dir,
        list(args.command),
        go_timeout_s=args.go_timeout,
        owner_pid=args.owner_pid,
        subreaper=not args.no_subreaper,
        termination_log=args.termination_log,
    )
    return launcher.run()


if __name__ == "__main__":
    sys.exit(main())
