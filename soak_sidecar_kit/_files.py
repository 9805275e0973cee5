"""The trainer's files in the progress dir (``contract``), written so that a reader never sees half
of one, and read back (a resume's record) without following a link or reading without bound.

Never raises for the disk: a soak's bookkeeping must not end the training it watches. A write that
fails is logged once per file, and the sidecar then judges what is missing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from soak_sidecar_kit import contract

log = logging.getLogger("soak_sidecar_kit")

# progress.jsonl is started again (the old one kept as .1) past this size: days of one line a second.
PROGRESS_MAX_BYTES = 8 * 1024 * 1024


class ProgressDir:
    """The progress dir this process writes into, and the run's checkpoint record that outlives the
    attempt (``$SOAK_CHECKPOINT_RECORD``), when the sidecar names one elsewhere."""

    def __init__(self, path: Path, run_record: str | None) -> None:
        self.path = path
        own = (path / contract.CHECKPOINT_FILE).absolute()
        self._run_record = None if run_record is None or Path(run_record).absolute() == own else run_record
        self._failed: set[str] = set()

    def append_record(self, record: Mapping[str, Any]) -> None:
        """One progress record; a line the sidecar would refuse (too long) is not written."""
        line = json.dumps(record, allow_nan=False) + "\n"
        if len(line.encode()) > contract.RECORD_LINE_LIMIT:
            self._failed_once(
                "progress record", ValueError(f"longer than {contract.RECORD_LINE_LIMIT} bytes")
            )
            return
        path = self.path / contract.PROGRESS_RECORDS_FILE
        try:
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_size > PROGRESS_MAX_BYTES:
                    os.replace(path, path.with_name(contract.PROGRESS_RECORDS_FILE + ".1"))
            with path.open("a", encoding="utf-8") as out:
                out.write(line)
        except OSError as exc:
            self._failed_once(contract.PROGRESS_RECORDS_FILE, exc)

    def write_checkpoint(self, record: Mapping[str, Any]) -> None:
        """The attempt's record (the sidecar counts this attempt's checkpoints by it), then the run's,
        which the next attempt resumes from."""
        self._write_json(self.path / contract.CHECKPOINT_FILE, record)
        if self._run_record is not None:
            self._write_json(Path(self._run_record), record)

    def write_summary(self, document: Mapping[str, Any]) -> None:
        self._write_json(self.path / contract.SUMMARY_FILE, document)

    def _write_json(self, path: Path, document: Mapping[str, Any]) -> None:
        """Whole or absent: a temp file beside it, then one rename. The temp name holds the host too:
        the nodes of a multi-node soak may write one record on a shared volume, with the same PIDs."""
        tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(document, allow_nan=False, indent=1) + "\n", encoding="utf-8")
            os.replace(tmp, path)
        except (OSError, ValueError) as exc:
            self._failed_once(str(path), exc)

    def _failed_once(self, what: str, error: Exception) -> None:
        if what not in self._failed:
            self._failed.add(what)
            log.warning("soak_sidecar_kit: could not write %s: %s", what, error)


def size_of(path: str, limit: int = 100_000) -> int | None:
    """Bytes of a checkpoint file, or of the regular files under a checkpoint directory (at most
    ``limit`` entries looked at; no symlink followed)."""
    try:
        if not os.path.isdir(path):
            return os.stat(path).st_size
    except OSError:
        return None
    total, seen = 0, 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            seen += 1
            if seen > limit:
                return total
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(root, name))
                total += 0 if os.path.islink(os.path.join(root, name)) else info.st_size
    return total


def read_record(path: str) -> dict[str, Any] | None:
    """A JSON object of at most the contract's checkpoint bound, not through a symlink, never waiting
    on a FIFO; None for anything else."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        data = os.read(fd, contract.CHECKPOINT_LIMIT_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > contract.CHECKPOINT_LIMIT_BYTES:
        return None
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
