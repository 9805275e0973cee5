"""The container's termination message: the one channel that needs no API server."""

from __future__ import annotations

import os
from pathlib import Path

from sidecar.adapters.fsutil import write_fsync
from sidecar.core.errors import PublishError
from sidecar.core.publication import MAX_TERMINATION_MESSAGE_BYTES, truncate_utf8


def write_termination_message(path: Path, text: str) -> None:
    """Write the container's termination message (<= 4096 bytes).

    The kubelet mounts the file, so it is written in place rather than renamed over.
    """
    data = truncate_utf8(text, MAX_TERMINATION_MESSAGE_BYTES).encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_fsync(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        raise PublishError(f"cannot write termination message {path}: {exc}") from exc
