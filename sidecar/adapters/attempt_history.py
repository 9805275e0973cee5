"""Where earlier attempts of a run left their evidence: the local output directory and the bucket.

Only read, bounded and never through a link: a provisional record is small (PROVISIONAL_LIMIT_BYTES),
a listing stops after MAX_KEYS keys. What cannot be read is left out, with the reason raised as a
TransientError the caller reports (finding lost attempts never stops a run).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from sidecar.adapters.s3_client import BotoErrors, make_s3_client
from sidecar.core.artifact.lost import PROVISIONAL_LIMIT_BYTES, FoundAttempt
from sidecar.core.artifact.objects import ARTIFACT_FILE, PROVISIONAL_PREFIX
from sidecar.core.errors import TransientError
from sidecar.settings import S3Settings

MAX_ENTRIES = 10_000
MAX_KEYS = 100_000


def _read_small(path: Path) -> bytes | None:
    """At most PROVISIONAL_LIMIT_BYTES + 1 bytes of a regular file; None when it is not one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return file.read(PROVISIONAL_LIMIT_BYTES + 1)


def _newest(directory: Path) -> float | None:
    times = []
    with os.scandir(directory) as entries:
        for count, entry in enumerate(entries):
            if count >= MAX_ENTRIES:
                break
            if entry.is_file(follow_symlinks=False):
                times.append(entry.stat(follow_symlinks=False).st_mtime)
    return max(times, default=None)


class LocalAttemptHistory:
    """Attempt directories under ``<output>/runs/<run_id>/``: artifact.json is the provisional
    artifact until the final one replaces it."""

    def __init__(self, runs_dir: Path) -> None:
        self._runs_dir = runs_dir

    def find(self, run_id: str, runs_prefix: str) -> list[FoundAttempt]:
        base = self._runs_dir / run_id
        found: list[FoundAttempt] = []
        try:
            with os.scandir(base) as entries:
                dirs = [
                    Path(e.path)
                    for n, e in enumerate(entries)
                    if n < MAX_ENTRIES and e.is_dir(follow_symlinks=False)
                ]
            for directory in dirs:
                record = _read_small(directory / ARTIFACT_FILE)
                if record is None:
                    continue
                found.append(
                    FoundAttempt(
                        location=str(directory / ARTIFACT_FILE),
                        final=len(record) > PROVISIONAL_LIMIT_BYTES,
                        record=record,
                        last_unix=_newest(directory),
                    )
                )
        except FileNotFoundError:
            return found
        except OSError as exc:
            raise TransientError(f"cannot look for earlier attempts in {base}: {exc}") from exc
        return found


class S3AttemptHistory:
    """Attempt prefixes under the run's common prefix in the bucket: one with a provisional record
    and no artifact.json ended without a verdict (the run id is checked in the record)."""

    def __init__(self, settings: S3Settings, client: Any = None) -> None:
        self._bucket = settings.bucket or ""
        self._settings = settings
        self._client = client

    def find(self, run_id: str, runs_prefix: str) -> list[FoundAttempt]:
        prefix = runs_prefix
        try:
            client = self._client or make_s3_client(self._settings)
            groups = self._groups(client, prefix)
            return [self._found(client, directory, keys) for directory, keys in groups.items()]
        except BotoErrors as exc:
            raise TransientError(
                f"cannot look for earlier attempts under s3://{self._bucket}/{prefix}: {exc}"
            ) from exc

    def _groups(self, client: Any, prefix: str) -> dict[str, dict[str, float]]:
        """Attempt prefix -> {object name: LastModified}, for prefixes holding a provisional record."""
        groups: dict[str, dict[str, float]] = {}
        listed = 0
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self._bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                directory, _, name = item["Key"].rpartition("/")
                groups.setdefault(directory + "/", {})[name] = item["LastModified"].timestamp()
                listed += 1
            if listed >= MAX_KEYS:
                break
        return {d: keys for d, keys in groups.items() if any(k.startswith(PROVISIONAL_PREFIX) for k in keys)}

    def _found(self, client: Any, directory: str, keys: dict[str, float]) -> FoundAttempt:
        latest = max(k for k in keys if k.startswith(PROVISIONAL_PREFIX))
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
