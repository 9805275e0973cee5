"""The sidecar's own directories, checked before a run: a usage error now, not a lost artifact later."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from sidecar.core.errors import ConfigError


def require_dirs(*, writable: Sequence[Path], readable: Sequence[Path]) -> None:
    """Create and check ``writable`` (write and search access); check that ``readable`` exists
    and can be listed (it is someone else's, e.g. the trainer's read-only progress volume)."""
    for directory in writable:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot use directory {directory}: {exc}") from exc
        if not os.access(directory, os.W_OK | os.X_OK):
            raise ConfigError(f"directory {directory} is not writable")
    for directory in readable:
        if not (directory.is_dir() and os.access(directory, os.R_OK | os.X_OK)):
            raise ConfigError(f"directory {directory} is missing or not readable")


class LocalWorkDirs:
    """Implements the WorkDirs port on this filesystem."""

    def require(self, *, writable: Sequence[Path], readable: Sequence[Path]) -> None:
        require_dirs(writable=writable, readable=readable)
