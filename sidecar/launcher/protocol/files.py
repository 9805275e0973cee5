"""How a run-dir record is written and read, the same on both sides, and the one way any file that
the trainer or the bucket can touch is opened (``open_regular``, ``read_regular``): no symlink
followed, no FIFO or device waited on, at most a bounded number of bytes, one error style (OSError;
``UnsafeFileError`` for a file refused). A write goes through a temp file and a rename, so no reader
sees half a record."""

from __future__ import annotations

import contextlib
import errno
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
        return read_regular(path, limit)
    except OSError:
        return None


class UnsafeFileError(OSError):
    """A file refused: a symbolic link, anything but a regular file, a second name of one (where
    asked), or longer than its limit. Its message says which, e.g. "it is a symbolic link"."""


_NO_FOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def open_regular(
    path: str | os.PathLike[str],
    *,
    dir_fd: int | None = None,
    flags: int = os.O_RDONLY,
    mode: int = 0o644,
    single_name: bool = False,
) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file at ``path`` and its stat, the caller to close it. Opened
    without following a symlink (O_NOFOLLOW) or waiting on a FIFO (O_NONBLOCK), close-on-exec;
    ``flags`` may add O_WRONLY, O_CREAT and the like. FileNotFoundError when absent,
    UnsafeFileError for a link, anything but a regular file, or (``single_name``) a file with a
    second name (a hard link), OSError otherwise."""
    try:
        fd = os.open(path, flags | _NO_FOLLOW, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFileError("it is a symbolic link (not followed)") from exc
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in _KINDS if test(info.st_mode)), "a device")
            raise UnsafeFileError(f"it is not a regular file ({kind})")
        if single_name and info.st_nlink != 1:
            raise UnsafeFileError(f"it is not a file of one name ({info.st_nlink} hard links)")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def read_up_to(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes from ``fd``'s position (a read may be short: read until the end)."""
    chunks: list[bytes] = []
    left = limit
    while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_regular(path: str | os.PathLike[str], limit: int, *, dir_fd: int | None = None) -> bytes:
    """The bytes of the regular file at ``path`` (see ``open_regular``); UnsafeFileError when it is
    longer than ``limit`` bytes."""
    fd, _ = open_regular(path, dir_fd=dir_fd)
    try:
        data = read_up_to(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnsafeFileError(f"it is larger than {limit} bytes")
    return data
