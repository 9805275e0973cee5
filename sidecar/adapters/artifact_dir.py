"""The attempt's local artifact directory: artifact.json, the samples stream, console log copies."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from sidecar.adapters.fsutil import open_for_writing, write_atomic
from sidecar.core.errors import ConfigError
from sidecar.launcher.protocol.files import open_regular


class SamplesFile:
    """The compressed JSONL stream of every sample. A write error (disk full) is kept, not raised:
    monitoring goes on, and the verdict reports the incomplete evidence as a monitor failure.

    Each sample is sync-flushed (zlib's Z_SYNC_FLUSH) to the file as it is taken: whatever ends the
    sidecar, a SIGKILL included, every sample before it can be read back (the stream then only lacks
    gzip's trailer, which ``soak-sidecar report`` and ``zcat`` tolerate)."""

    def __init__(self, path: Path) -> None:
        self.error: str | None = None
        # Bytes in the file up to the end of the last sample written whole: a segment ends there.
        self.flushed_bytes = 0
        self._file: IO[bytes] | None = None
        self._stream: IO[str] | None = None
        try:
            self._file = os.fdopen(open_for_writing(path), "wb")
            self._stream = gzip.open(self._file, "wt", encoding="utf-8")  # noqa: SIM115 (closed in close())
        except OSError as exc:
            self.close()
            self.error = f"cannot write {path}: {exc}"

    def write_line(self, line: str) -> None:
        if self._stream is None:
            return
        try:
            self._stream.write(line + "\n")
            self._stream.flush()  # through gzip (a sync flush) and the file's buffer to the kernel
            if self._file is not None:
                self.flushed_bytes = self._file.tell()
        except OSError as exc:
            self.error = f"writing the samples file failed: {exc}"
            self.close()

    def close(self) -> None:
        """The gzip stream, then the file under it (gzip does not close a file it was given)."""
        for handle in (self._stream, self._file):
            if handle is None:
                continue
            try:
                handle.close()
            except OSError as exc:
                self.error = self.error or f"closing the samples file failed: {exc}"
        self._stream = self._file = None


# What tells one console file from another that got its inode number after it was deleted.
HEAD_BYTES = 256
# The launcher keeps its console logs within console_log_bytes (64 MiB by default) in all.
COPY_LIMIT_BYTES = 64 * 1024 * 1024


def _copy_regular_file(source: Path, target: Path, limit: int) -> None:
    """Copy at most ``limit`` bytes of ``source`` from one descriptor opened without following a
    symlink or waiting on a FIFO; OSError when it is not a regular file."""
    fd, _ = open_regular(source)
    try:
        writer_fd = open_for_writing(target)  # a link planted at the copy's name is never written through
        with os.fdopen(os.dup(fd), "rb") as reader, os.fdopen(writer_fd, "wb") as writer:
            left = limit
            while left > 0 and (chunk := reader.read(min(left, 1 << 20))):
                writer.write(chunk)
                left -= len(chunk)
    finally:
        os.close(fd)


class ArtifactDir:
    """Implements the ArtifactFiles port over one local directory."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def create(self) -> None:
        """Before the trainer starts: an unusable directory is a usage error now, not a lost artifact."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot use artifact directory {self.path}: {exc}") from exc

    def open_samples(self, name: str) -> SamplesFile:
        return SamplesFile(self.path / name)

    def write(self, name: str, data: bytes) -> Path:
        """Atomically and durably; OSError when the directory is unusable (disk full, read-only)."""
        self.path.mkdir(parents=True, exist_ok=True)
        target = self.path / name
        write_atomic(target, data)
        return target

    def keep_copies(self, files: Sequence[Path]) -> list[Path]:
        """Copies of ``files`` here (made once), e.g. the console logs of a run dir the next run
        reuses. The trainer can write that run dir: a source that is a symlink (say, to
        /proc/self/environ), a FIFO or a device is not copied, and at most COPY_LIMIT_BYTES are."""
        kept: list[Path] = []
        for source in files:
            copy = self.path / source.name
            with contextlib.suppress(OSError):
                if not copy.exists() or copy.is_symlink():
                    self.path.mkdir(parents=True, exist_ok=True)
                    _copy_regular_file(source, copy, COPY_LIMIT_BYTES)
                kept.append(copy)
        return kept

    def read_span(
        self, source: Path, offset_for: Callable[[int, bytes], int], limit: int
    ) -> tuple[int, bytes, int, bytes]:
        """(the file's inode, its first HEAD_BYTES, the offset read from, at most ``limit`` bytes
        from there), the offset chosen by ``offset_for(inode, head)``: a rotated log keeps its
        inode, a new file that got a freed inode number has other first bytes. A regular file only,
        opened without following a link or waiting on a FIFO (console logs are in the trainer's run
        dir); OSError when it cannot be read."""
        fd, found = open_regular(source)
        try:
            head = os.pread(fd, HEAD_BYTES, 0)
            offset = offset_for(found.st_ino, head)
            return found.st_ino, head, offset, os.pread(fd, limit, offset) if limit > 0 else b""
        finally:
            os.close(fd)

    def existing(self, names: Sequence[str]) -> list[Path]:
        return [self.path / name for name in names if (self.path / name).is_file()]

    def sha256(self, name: str) -> str | None:
        digest = hashlib.sha256()
        try:
            with (self.path / name).open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
        except OSError:
            return None
        return digest.hexdigest()
