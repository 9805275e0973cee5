"""Progress probe: the trainer's output directory as a backend-independent liveness signal."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from sidecar.core.samples import ProgressSample


class DirectoryProgressProbe:
    """Counts regular files under ``progress_dir`` (recursively), their bytes and newest mtime.

    Paths in ``exclude`` (the console log and its rotations) are left out: trainer chatter must
    not count as progress. Files that vanish while being read are skipped; a missing directory
    is an empty sample. Directory symlinks are not followed (no loops); file symlinks are, as in
    the seed (``Path.is_file``/``stat`` follow them).
    """

    def __init__(self, progress_dir: Path, *, exclude: Sequence[Path]) -> None:
        self._root = os.fspath(progress_dir)
        self._exclude = [os.fspath(path) for path in exclude]
        self._exclude_real = frozenset(os.path.realpath(path) for path in self._exclude)
        self._exclude_names = frozenset(os.path.basename(path) for path in self._exclude)

    def _excluded_inodes(self) -> set[tuple[int, int]]:
        # File identity catches a symlink or hard link to the console log; the path test in
        # sample() catches a log recreated by rotation after these inodes were read.
        inodes: set[tuple[int, int]] = set()
        for path in self._exclude:
            try:
                stat = os.stat(path)
            except OSError:
                continue
            inodes.add((stat.st_dev, stat.st_ino))
        return inodes

    def sample(self) -> ProgressSample:
        excluded = self._excluded_inodes()
        file_count = 0
        bytes_total = 0
        max_mtime: float | None = None
        pending = [self._root]
        while pending:
            try:
                with os.scandir(pending.pop()) as entries:
                    for entry in entries:
                        try:
                            if entry.is_dir(follow_symlinks=False):
                                pending.append(entry.path)
                                continue
                            if not entry.is_file():
                                continue
                            stat = entry.stat()
                        except OSError:
                            continue
                        if (stat.st_dev, stat.st_ino) in excluded or (
                            entry.name in self._exclude_names
                            and os.path.realpath(entry.path) in self._exclude_real
                        ):
                            continue
                        file_count += 1
                        bytes_total += stat.st_size
                        if max_mtime is None or stat.st_mtime > max_mtime:
                            max_mtime = stat.st_mtime
            except OSError:
                continue
        return ProgressSample(file_count=file_count, bytes_total=bytes_total, max_mtime=max_mtime)
