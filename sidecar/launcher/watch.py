"""inotify on the run dir, so a new go.json, control.json or heartbeat wakes the loop at once."""

from __future__ import annotations

import ctypes
import os
import struct

_IN_CLOSE_WRITE = 0x8
_IN_MOVED_TO = 0x80
_INOTIFY_HEADER = struct.Struct("iIII")


class DirWatch:
    """The names written or renamed into a directory since the last drain; ``fd`` is None where
    inotify is unavailable (the loop then polls)."""

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
            except OSError:  # BlockingIOError: nothing more to read
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
