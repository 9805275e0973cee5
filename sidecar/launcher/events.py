"""The launcher's one event loop: a select() over the signal wake-up pipe, the run dir's inotify,
the owner's pidfd and the trainer's output."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
from collections.abc import Callable

from .protocol.names import FORWARDED_SIGNALS
from .watch import DirWatch


class EventLoop:
    def __init__(self, run_dir: str, owner_pid: int | None) -> None:
        self.owner_pid = owner_pid
        self.watch = DirWatch(run_dir)
        self._sel = selectors.DefaultSelector()
        self._dirty: set[str] = set()
        self._pending: list[int] = []
        self._wake_r: int | None = None
        self._owner_fd: int | None = None
        self._owner_gone = False

    def install(self) -> None:
        """Signals (SIGCHLD and the forwarded ones) recorded and waking select(); the watch and
        the owner's pidfd registered (without a pidfd, owner_lost() falls back to getppid())."""
        read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_r = read_fd
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

        def record(signum: int, _frame: object) -> None:
            self._pending.append(signum)

        signal.signal(signal.SIGCHLD, record)
        for name in FORWARDED_SIGNALS:
            signal.signal(signal.Signals[name], record)
        self._sel.register(read_fd, selectors.EVENT_READ, self._drain_wakeup)
        if self.watch.fd is not None:
            self._sel.register(self.watch.fd, selectors.EVENT_READ, self._on_watch)
        if self.owner_pid is not None:
            try:
                self._owner_fd = os.pidfd_open(self.owner_pid)
                self._sel.register(self._owner_fd, selectors.EVENT_READ, self._on_owner_exit)
            except (OSError, AttributeError):
                self._owner_fd = None

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
        self._sel.register(fd, selectors.EVENT_READ, callback)

    def remove_reader(self, fd: int) -> None:
        self._sel.unregister(fd)

    def turn(self, timeout: float | None) -> list[int]:
        """Wait for fds or the timeout, run their callbacks; the signals seen since the last turn."""
        for key, _mask in self._sel.select(None if timeout is None else max(0.0, timeout)):
            key.data()
        pending, self._pending = self._pending, []
        return [signum for signum in pending if signum != signal.SIGCHLD]

    def take_changed(self) -> set[str]:
        """Run-dir names written since the last call (empty without inotify)."""
        changed, self._dirty = self._dirty, set()
        return changed

    def owner_lost(self) -> bool:
        if self.owner_pid is None:
            return False
        return self._owner_gone or os.getppid() != self.owner_pid

    def _drain_wakeup(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r is not None and os.read(self._wake_r, 4096):
                pass

    def _on_watch(self) -> None:
        self._dirty |= self.watch.drain()

    def _on_owner_exit(self) -> None:
        self._owner_gone = True
        if self._owner_fd is not None:
            self._sel.unregister(self._owner_fd)
            os.close(self._owner_fd)
            self._owner_fd = None
