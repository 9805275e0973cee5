"""Where a run's ledger (``sidecar.core.ledger.record``) lives: beside the run's attempts in the
bucket, and in the run's local directory.

Every update reads the ledger, lets the caller change it, and writes it back only if it is still
what was read: in the bucket a conditional PUT (``If-Match`` its ETag, ``If-None-Match: *`` for a
new one), retried from the read when another attempt won the race; locally under an exclusive lock
on the run's directory, replaced atomically. A ledger that cannot be parsed is left as it is.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import random
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sidecar.adapters.fsutil import write_fsync
from sidecar.adapters.s3_client import (
    BotoErrors,
    ClientFactory,
    b64_digest,
    build_client,
    describe,
    is_conditional_conflict,
    is_not_found,
    is_precondition_failed,
    make_s3_client,
    write_args,
)
from sidecar.core.errors import ConfigError, UploadError
from sidecar.core.ledger.record import LEDGER_FILE, LEDGER_LIMIT_BYTES, Ledger, dumps_ledger, parse_ledger
from sidecar.core.ports import Clock
from sidecar.settings import S3Settings

Change = Callable[[Ledger | None], Ledger]
# Attempts ending at once (the indexes of a multi-pod soak) race for the one object: each lost race
# costs one read and one write, after a random pause that spreads the next round.
RACE_RETRIES = 32
RACE_PAUSE_S = 0.25
LOCK_WAIT_S = 10.0
LOCK_POLL_S = 0.05


class S3LedgerStore:
    def __init__(
        self, settings: S3Settings, clock: Clock, *, client_factory: ClientFactory = make_s3_client
    ) -> None:
        self._settings, self._clock = settings, clock
        self._bucket = settings.bucket or ""
        self._client, _ = build_client(settings, client_factory)

    def location(self, run_id: str, runs_prefix: str) -> str:
        return f"s3://{self._bucket}/{runs_prefix}{LEDGER_FILE}"

    def read(self, run_id: str, runs_prefix: str) -> Ledger | None:
        found = self._get(runs_prefix + LEDGER_FILE)
        return None if found is None else parse_ledger(found[0], self.location(run_id, runs_prefix))

    def update(self, run_id: str, runs_prefix: str, change: Change) -> Ledger:
        key, where = runs_prefix + LEDGER_FILE, self.location(run_id, runs_prefix)
        for _ in range(RACE_RETRIES):
            found = self._get(key)
            current = None if found is None else parse_ledger(found[0], where)
            changed = change(current)
            if current is not None and changed.revision == current.revision:
                return current  # nothing to add
            body = dumps_ledger(changed, now=self._clock.wall())
            digest = hashlib.sha256(body)
            args: dict[str, Any] = {
                **write_args(self._settings, digest.hexdigest()),
                "ChecksumSHA256": b64_digest(digest.digest()),  # the store verifies the bytes
                "ContentType": "application/json",
            }
            try:
                if found is None:
                    self._client.put_object(Bucket=self._bucket, Key=key, Body=body, IfNoneMatch="*", **args)
                else:
                    self._client.put_object(Bucket=self._bucket, Key=key, Body=body, IfMatch=found[1], **args)
            except BotoErrors as exc:
                if not (is_precondition_failed(exc) or is_conditional_conflict(exc)):
                    raise UploadError(f"cannot write {where}: {describe(exc, self._settings)}") from exc
                time.sleep(random.uniform(0, RACE_PAUSE_S))  # noqa: S311 - spreading retries, not a secret
                continue
            return changed
        raise UploadError(f"cannot write {where}: {RACE_RETRIES} other writers changed it first")

    def _get(self, key: str) -> tuple[bytes, str] | None:
        """(bytes, ETag) of the object, None when there is none."""
        try:
            answer = self._client.get_object(Bucket=self._bucket, Key=key)
            with answer["Body"] as body:
                data: bytes = body.read(LEDGER_LIMIT_BYTES + 1)
        except BotoErrors as exc:
            if is_not_found(exc):
                return None
            raise UploadError(
                f"cannot read s3://{self._bucket}/{key}: {describe(exc, self._settings)}"
            ) from exc
        return data, str(answer["ETag"])


class LocalLedgerStore:
    """``<runs>/<run-id>/ledger.json`` (the local output dir's runs)."""

    def __init__(self, runs: Path, clock: Clock, *, lock_wait_s: float = LOCK_WAIT_S) -> None:
        self._runs, self._clock, self._lock_wait_s = runs, clock, lock_wait_s

    def location(self, run_id: str, runs_prefix: str) -> str:
        return str(self._runs / run_id / LEDGER_FILE)

    def read(self, run_id: str, runs_prefix: str) -> Ledger | None:
        path = self._runs / run_id / LEDGER_FILE
        data = _read_regular(path)
        return None if data is None else parse_ledger(data, str(path))

    def update(self, run_id: str, runs_prefix: str, change: Change) -> Ledger:
        directory = self._runs / run_id
        path = directory / LEDGER_FILE
        try:
            with _locked(directory, self._lock_wait_s):
                data = _read_regular(path)
                current = None if data is None else parse_ledger(data, str(path))
                changed = change(current)
                if current is not None and changed.revision == current.revision:
                    return current
                staged, fd = _new_file(directory)
                try:
                    write_fsync(fd, dumps_ledger(changed, now=self._clock.wall()))
                finally:
                    os.close(fd)
                os.replace(staged, path)
        except OSError as exc:
            raise UploadError(f"cannot write {path}: {exc}") from exc
        return changed


def _new_file(directory: Path) -> tuple[Path, int]:
    """A new file of a random name: whatever else is in the directory (a FIFO, a link to another
    file) is never opened, waited on or truncated (O_EXCL)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    for _ in range(8):
        staged = directory / f".{LEDGER_FILE}.{secrets.token_hex(8)}.tmp"
        try:
            return staged, os.open(staged, flags, 0o644)
        except FileExistsError:
            continue
    raise OSError(f"no new file could be made in {directory}")


@contextmanager
def _locked(directory: Path, wait_s: float) -> Iterator[None]:
    """An exclusive lock on the run's directory, waited for ``wait_s`` at most: whoever else can
    open the directory (a local trainer runs as the same user) may hold it forever."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        give_up = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= give_up:
                    raise UploadError(
                        f"{directory} stayed locked by another process for {wait_s:g} s"
                    ) from None
                time.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)


def _read_regular(path: Path) -> bytes | None:
    """The file's bytes (bounded), None when absent; ConfigError for a link, a FIFO or a huge file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path} is not a regular file")
        return file.read(LEDGER_LIMIT_BYTES + 1)
