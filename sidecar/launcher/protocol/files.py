"""How a run-dir record is written and read, the same on both sides. The trainer can write the run
dir too: a read follows no symlink, never waits on a FIFO or device, and takes at most a bounded
number of bytes; a write goes through a temp file and a rename, so no reader sees half a record."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import uuid
from collections.abc import Mapping
from typing import Any

from .names import RECORD_LIMIT_BYTES


def atomic_write_json(path: str, payload: Mapping[str, Any], *, durable: bool = True) -> None:
    """Write JSON via temp file + rename; fsync file and directory when durable."""
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
    """A regular file's bytes as the other side wrote them, or None (absent, a link, not a regular
    file, unreadable, or longer than ``limit``)."""
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
