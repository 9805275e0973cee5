"""The checkpoint record (``contract``: checkpoint.json): the newest save complete on disk, which the
sidecar counts lost work from and a resumed attempt loads."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from soak_sidecar_kit import contract
from soak_sidecar_kit._files import read_record, size_of
from soak_sidecar_kit._progress import finite

log = logging.getLogger("soak_sidecar_kit")


def checkpoint_record(
    step: int,
    path: str | os.PathLike[str] | None,
    *,
    size_bytes: int | None,
    duration_s: float | None,
    now: float,
) -> dict[str, Any]:
    """The record of a save of ``step`` (the step a resumed attempt goes on from) at ``path``; its
    size measured when not given. A field the sidecar would refuse is left out, with a warning."""
    if not 0 <= int(step) <= contract.MAX_INTEGER:
        raise ValueError(f"soak_sidecar_kit: a checkpoint's step must be an integer >= 0, got {step!r}")
    record: dict[str, Any] = {"step": int(step), "t": round(now, 3)}
    if path is not None:
        where = os.path.abspath(os.fspath(path))
        if len(where) <= contract.PATH_CHARS:
            record["path"] = where
            size = size_of(where) if size_bytes is None else int(size_bytes)
            if size is not None and 0 <= size <= contract.MAX_INTEGER:
                record["bytes"] = size
        else:
            log.warning(
                "soak_sidecar_kit: a checkpoint path longer than %d characters is not recorded",
                contract.PATH_CHARS,
            )
    if duration_s is not None and (seconds := finite(duration_s)) is not None and seconds >= 0:
        record["duration_s"] = seconds
    return record


def resume_from(approved: str | None) -> tuple[str | None, int | None]:
    """What an attempt resumes from: the ``path`` and ``step`` of the approved record (a file of
    this kit's), or the approved file itself and no step; (None, None) on a fresh start."""
    if approved is None:
        return None, None
    record = read_record(approved)
    if record is None:
        return approved, None
    step = record.get("step")
    step = step if isinstance(step, int) and not isinstance(step, bool) else None
    path = record.get("path")
    if isinstance(path, str) and path:
        return str(Path(approved).parent / path), step
    return approved, step
