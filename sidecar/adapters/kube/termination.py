"""The sidecar container's termination message: the one channel that needs no API server."""

from __future__ import annotations

from pathlib import Path

from sidecar.core.errors import PublishError
from sidecar.core.publication import MAX_TERMINATION_MESSAGE_BYTES, truncate_utf8
from sidecar.launcher.protocol.termination import write_termination_message as write_message


def write_termination_message(path: Path, text: str) -> None:
    """Write the container's termination message, marked when cut to the kubelet's cap."""
    try:
        write_message(str(path), truncate_utf8(text, MAX_TERMINATION_MESSAGE_BYTES))
    except OSError as exc:
        raise PublishError(f"cannot write termination message {path}: {exc}") from exc
