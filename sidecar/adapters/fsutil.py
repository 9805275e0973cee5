"""Durable local file writes, one home for every adapter (the launcher keeps its own stdlib copy)."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a directory entry (create, rename, link, unlink) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_fsync(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (a write may be short) and fsync it."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
    os.fsync(fd)


# A file the sidecar creates: never through a link someone planted at its name, never an old file.
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def open_for_writing(path: Path) -> int:
    """A descriptor to write ``path`` from its start: a symlink planted at the name is removed (the
    link, never what it points to), and the open follows none."""
    if path.is_symlink():
        path.unlink()
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)


def write_atomic(path: Path, data: bytes) -> None:
    """Temp file, fsync, rename, fsync of the directory: a reader sees the old or the new file. The
    temp name is unguessable and created afresh, and the rename replaces a link at ``path`` rather
    than writing through it."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        fd = os.open(tmp, CREATE_FLAGS, 0o644)
        try:
            write_fsync(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)
