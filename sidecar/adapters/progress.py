"""Progress probe: the trainer's output directory as a backend-independent liveness signal, and
its structured progress records (``progress.jsonl``, sidecar.core.progress_records) read as they
are appended."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from sidecar.core.progress_records import PROGRESS_RECORDS_FILE, ProgressRecord, read_records
from sidecar.core.samples import ProgressSample
from sidecar.launcher.protocol.files import open_regular, read_up_to

# No symlink followed, no wait on a FIFO with no writer, nothing inherited by a child.


# How many entries of the progress dir a sample looks at (a checkpoint dir holds hundreds).
MAX_PROGRESS_ENTRIES = 100_000
# How much of progress.jsonl one sample reads at most: the newest lines, where a backlog is longer.
MAX_RECORDS_READ = 256 * 1024


class RecordTail:
    """progress.jsonl read from where the last read ended: the newest record and the refusals.

    Only complete lines are read (a partial last line waits for its newline); a file replaced
    (another inode) or cut shorter (rotated, truncated) is read again from its start; a backlog
    longer than MAX_RECORDS_READ is skipped to its newest lines. Never a link, never a FIFO.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._identity: tuple[int, int] | None = None
        self._offset = 0
        self.newest: ProgressRecord | None = None
        self.refused = 0

    def read(self) -> None:
        try:
            fd, info = open_regular(self._path)
        except OSError:
            return  # none yet, or not a file the sidecar reads
        try:
            identity = (info.st_dev, info.st_ino)
            if identity != self._identity or info.st_size < self._offset:
                self._identity, self._offset = identity, 0
            start = max(self._offset, info.st_size - MAX_RECORDS_READ)
            os.lseek(fd, start, os.SEEK_SET)
            chunk = read_up_to(fd, min(info.st_size - start, MAX_RECORDS_READ))
        finally:
            os.close(fd)
        if start > self._offset and b"\n" in chunk:  # skipped into a line: start after it
            cut = chunk.index(b"\n") + 1
            chunk, start = chunk[cut:], start + cut
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset = start + len(complete)
        found = read_records(complete)
        self.newest = found.newest or self.newest
        self.refused += found.refused


def _a_directory(path: str) -> bool:
    """The path itself, not a link, is a directory (locally the trainer could swap it for a link)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


class DirectoryProgressProbe:
    """Counts regular files under ``progress_dir`` (recursively), their bytes and newest mtime.

    Files in ``exclude`` (the console log and its rotations) are left out, matched by file
    identity so a symlink or hard link to them is left out too: trainer chatter must not count
    as progress. Files that vanish while being read are skipped; a missing directory is an
    empty sample. No symlink is followed, the progress dir's own included (stricter than the
    seed, which followed file links): only the trainer's own files count as its progress.
    """

    def __init__(self, progress_dir: Path, *, exclude: Sequence[Path]) -> None:
        self._root = os.fspath(progress_dir)
        self._exclude = [os.fspath(path) for path in exclude]
        self._records = RecordTail(os.path.join(self._root, PROGRESS_RECORDS_FILE))

    def _excluded_inodes(self) -> set[tuple[int, int]]:
        inodes: set[tuple[int, int]] = set()
        for path in self._exclude:
            try:
                stat = os.stat(path)
            except OSError:
                continue
            inodes.add((stat.st_dev, stat.st_ino))
        return inodes

    def sample(self) -> ProgressSample:
        """The files of the progress dir, at most MAX_PROGRESS_ENTRIES entries of it: the trainer
        decides how many it holds, and a sample must stay bounded in time and memory."""
        files: list[tuple[int, int, int, float]] = []
        excluded = self._excluded_inodes()
        pending = [self._root] if _a_directory(self._root) else []
        seen = 0
        while pending and seen < MAX_PROGRESS_ENTRIES:
            try:
                with os.scandir(pending.pop()) as entries:
                    for entry in entries:
                        seen += 1
                        if seen > MAX_PROGRESS_ENTRIES:
                            break
                        try:
                            if entry.is_dir(follow_symlinks=False):
                                pending.append(entry.path)
                                continue
                            # A link's target may be a file the trainer does not write (the
                            # sidecar's heartbeat): it would look like progress while it hangs.
                            if not entry.is_file(follow_symlinks=False):
                                continue
                            info = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        files.append((info.st_dev, info.st_ino, info.st_size, info.st_mtime))
            except OSError:
                continue
        # Identities taken before and after the walk: a log rotated meanwhile is excluded
        # under its old and its new inode.
        excluded |= self._excluded_inodes()
        kept = [(size, mtime) for dev, ino, size, mtime in files if (dev, ino) not in excluded]
        self._records.read()
        record = self._records.newest
        return ProgressSample(
            file_count=len(kept),
            bytes_total=sum(size for size, _ in kept),
            max_mtime=max((mtime for _, mtime in kept), default=None),
            records_refused=self._records.refused,
            **({} if record is None else _fields(record)),
        )

    def read_file(self, name: str, max_bytes: int) -> tuple[bytes, float] | None:
        """Up to ``max_bytes + 1`` bytes of a regular file in the progress dir, with its mtime (one
        open, so both describe the same file). None when there is no such file; OSError when it
        cannot be read, or is a symbolic link (never followed) or not a regular file (a FIFO or a
        device would hang or never end)."""
        try:
            fd, info = open_regular(os.path.join(self._root, name))
        except FileNotFoundError:
            return None
        try:
            return read_up_to(fd, max_bytes + 1), info.st_mtime
        finally:
            os.close(fd)


def _fields(record: ProgressRecord) -> dict[str, object]:
    return {
        "step": record.step,
        "phase": record.phase,
        "total_steps": record.total_steps,
        "samples": record.samples,
        "tokens": record.tokens,
        "loss": record.loss,
    }
