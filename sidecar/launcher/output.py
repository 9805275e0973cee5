"""Output: the trainer's to a bounded console log and (never blocking) to our stdout; our own
messages to stderr, never blocking either."""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import threading
import time
from collections import deque

from .protocol.names import CONSOLE_LOG

# The launcher's own messages waiting for a slow stderr reader; beyond this they are dropped.
STDERR_QUEUE_BYTES = 256 * 1024
# Trainer output waiting for a slow stdout reader; beyond this it is dropped (console.log has it).
STDOUT_QUEUE_BYTES = 1 << 20
# At most one "output not shown" note per this many seconds.
DROP_NOTE_INTERVAL_S = 5.0
# Bounded time to flush at exit: a stalled reader never holds up the launcher's exit.
STDOUT_FLUSH_S = 1.0
STDERR_FLUSH_S = 0.5
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
STDERR = FdWriter(2, STDERR_QUEUE_BYTES)


def log(message: str) -> None:
    STDERR.put(f"[soak-launcher] {message}\n".encode(errors="replace"))


class OutputTee:
    """The trainer's output to our stdout through an FdWriter, saying on stderr (at most every
    DROP_NOTE_INTERVAL_S) how much a slow reader missed."""

    def __init__(self, writer: FdWriter) -> None:
        self.writer = writer
        self._dropped_noted = 0
        self._drop_noted_at = -math.inf
        self._error_noted = False

    def put(self, data: bytes) -> None:
        self.writer.put(data)

    def note(self, *, final: bool = False) -> None:
        if self.writer.error is not None and not self._error_noted:
            self._error_noted = True
            log(f"stdout write failed ({self.writer.error}); trainer output goes to {CONSOLE_LOG} only")
        new = self.writer.dropped_bytes - self._dropped_noted
        now = time.monotonic()
        if new > 0 and (final or now - self._drop_noted_at >= DROP_NOTE_INTERVAL_S):
            self._dropped_noted += new
            self._drop_noted_at = now
            log(f"{new} bytes of trainer output not shown (stdout reader too slow)")

    def close(self) -> None:
        """Give the writer a bounded time to flush; what it could not write is dropped."""
        self.writer.close(STDOUT_FLUSH_S)
        self.note(final=True)


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
