"""Where earlier attempts of a run left their evidence: the local output directory and the bucket.

Others can write both, so only read, bounded and never through a link: at most MAX_ATTEMPT_PLACES
attempt locations are looked at, each record read up to PROVISIONAL_LIMIT_BYTES and handed on one
at a time (the caller judges it and drops it), listings stop after MAX_KEYS keys. A failure to read
is raised as a TransientError the caller reports (finding lost attempts never stops a run).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sidecar.adapters.s3_client import BotoErrors, make_s3_client
from sidecar.core.artifact.lost import PROVISIONAL_LIMIT_BYTES, FoundAttempt
from sidecar.core.artifact.objects import ARTIFACT_FILE, newest_provisional
from sidecar.core.errors import TransientError
from sidecar.launcher.protocol.files import open_regular, read_up_to
from sidecar.settings import S3Settings

MAX_ATTEMPT_PLACES = 1_000
MAX_ENTRIES = 10_000
MAX_KEYS = 100_000
# An attempt's local directory (sidecar.app.supervisor names them): attempt-N, index-K-attempt-N,
# either with a -<pod> label.
ATTEMPT_DIR = re.compile(r"(?:index-[0-9]{1,9}-)?attempt-[0-9]{1,9}(?:-[A-Za-z0-9.-]{1,253})?")


def _read_small(path: Path) -> bytes | None:
    """At most PROVISIONAL_LIMIT_BYTES + 1 bytes of a regular file; None when it is not one."""
    try:
        fd, _ = open_regular(path)
    except OSError:
        return None
    try:
        return read_up_to(fd, PROVISIONAL_LIMIT_BYTES + 1)
    finally:
        os.close(fd)


def _newest(directory: Path) -> float | None:
    """The newest mtime of the first MAX_ENTRIES regular files in ``directory``."""
    newest: float | None = None
    with os.scandir(directory) as entries:
        for count, entry in enumerate(entries):
            if count >= MAX_ENTRIES:
                break
            if entry.is_file(follow_symlinks=False):
                mtime = entry.stat(follow_symlinks=False).st_mtime
                newest = mtime if newest is None else max(newest, mtime)
    return newest


class LocalAttemptHistory:
    """Attempt directories under ``<output>/runs/<run_id>/``: artifact.json is the provisional
    artifact until the final one replaces it."""

    def __init__(self, runs_dir: Path) -> None:
        self._runs_dir = runs_dir

    def find(self, run_id: str, runs_prefix: str) -> Iterator[FoundAttempt]:
        base = self._runs_dir / run_id
        try:
            for directory in self._attempt_dirs(base):
                record = _read_small(directory / ARTIFACT_FILE)
                if record is not None:
                    yield FoundAttempt(
                        location=str(directory / ARTIFACT_FILE),
                        final=len(record) > PROVISIONAL_LIMIT_BYTES,
                        record=record,
                        last_unix=_newest(directory),
                    )
        except OSError as exc:
            raise TransientError(f"cannot look for earlier attempts in {base}: {exc}") from exc

    @staticmethod
    def _attempt_dirs(base: Path) -> list[Path]:
        found: list[Path] = []
        try:
            with os.scandir(base) as entries:
                for count, entry in enumerate(entries):
                    if count >= MAX_ENTRIES or len(found) >= MAX_ATTEMPT_PLACES:
                        break
                    if ATTEMPT_DIR.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                        found.append(Path(entry.path))
        except FileNotFoundError:
            return []
        return found


class S3AttemptHistory:
    """Attempt prefixes under the run's common prefix in the bucket: one with a provisional record
    and no artifact.json ended without a verdict (the run id is checked in the record)."""

    def __init__(self, settings: S3Settings, client: Any = None) -> None:
        self._bucket = settings.bucket or ""
        self._settings = settings
        self._client = client

    def find(self, run_id: str, runs_prefix: str) -> Iterator[FoundAttempt]:
        try:
            client = self._client or make_s3_client(self._settings)
            for directory, keys in self._groups(client, runs_prefix).items():
                yield self._found(client, directory, keys)
        except BotoErrors as exc:
            raise TransientError(
                f"cannot look for earlier attempts under s3://{self._bucket}/{runs_prefix}: {exc}"
            ) from exc

    def _groups(self, client: Any, prefix: str) -> dict[str, dict[str, float]]:
        """Attempt prefix -> {object name: LastModified}, for at most MAX_ATTEMPT_PLACES prefixes
        holding a provisional record."""
        groups: dict[str, dict[str, float]] = {}
        listed = 0
        # Folders of other runs or files count too: at most four times as many are kept.
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self._bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                directory, _, name = item["Key"].rpartition("/")
                if directory + "/" in groups or len(groups) < MAX_ATTEMPT_PLACES * 4:
                    groups.setdefault(directory + "/", {})[name] = item["LastModified"].timestamp()
                listed += 1
            if listed >= MAX_KEYS:
                break
        with_records = [(d, keys) for d, keys in groups.items() if newest_provisional(keys) is not None]
        return dict(with_records[:MAX_ATTEMPT_PLACES])

    def _found(self, client: Any, directory: str, keys: dict[str, float]) -> FoundAttempt:
        latest = newest_provisional(keys) or ""
        final = ARTIFACT_FILE in keys
        record = None
        if not final:
            body = client.get_object(Bucket=self._bucket, Key=directory + latest)["Body"]
            with body:
                record = body.read(PROVISIONAL_LIMIT_BYTES + 1)
        return FoundAttempt(
            location=f"s3://{self._bucket}/{directory}{latest}",
            final=final,
            record=record,
            last_unix=max(keys.values()),
        )
