"""A container's termination message: the one channel to the pod status that needs no API server.
Both sides write one (the launcher for the trainer container, the sidecar for its own), the same way."""

from __future__ import annotations

import os

from .names import TERMINATION_MESSAGE_BYTES


def write_termination_message(path: str, text: str) -> None:
    """Write ``text``, cut to the kubelet's cap on a character boundary, in place (the kubelet mounts
    the file, so no rename), through no symlink. Raises OSError."""
    data = text.encode("utf-8", errors="replace")[:TERMINATION_MESSAGE_BYTES]
    data = data.decode("utf-8", errors="ignore").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
