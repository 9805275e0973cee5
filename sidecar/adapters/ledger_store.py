"""Where a run's ledger (``sidecar.core.ledger.record``) lives: beside the run's attempts in the
bucket, and in the run's local directory.

In the bucket, every attempt first writes what it adds as a new object of its own
(``ledger.d/<random>.json``, the ledger's own format): that write never races another, so a
thousand indexes ending together each land with one PUT. It then folds its own and a bounded number
of other pending pieces into ``ledger.json`` with a conditional PUT (``If-Match`` its ETag,
``If-None-Match: *`` for a new one) and deletes the pieces it folded; a fold that loses the race a
few times is left to later writers. Readers take ``ledger.json`` together with the pieces not yet
folded, so nothing written is ever missing from a read. Locally, updates run under an exclusive
lock on the run's directory and replace the file atomically. A ledger that cannot be parsed is left
as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import random
import secrets
import time
import uuid
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
    http_status,
    is_conditional_conflict,
    is_not_found,
    is_precondition_failed,
    make_s3_client,
    write_args,
)
from sidecar.core.errors import ConfigError, UploadError
from sidecar.core.ledger.record import (
    LEDGER_FILE,
    LEDGER_LIMIT_BYTES,
    LEDGER_PIECES,
    Ledger,
    dumps_ledger,
    parse_ledger,
    with_entry,
)
from sidecar.core.ports import Clock
from sidecar.launcher.protocol.files import UnsafeFileError, open_regular, read_up_to
from sidecar.settings import S3Settings

Change = Callable[[Ledger | None], Ledger]
PIECES = f"{LEDGER_PIECES}/"
# One attempt's piece is a few KiB; anything larger is not one of ours and is passed over. All the
# pieces one read takes are bounded like one ledger: anyone who can write the bucket can plant them.
PIECE_LIMIT_BYTES = 64 * 1024
PIECES_LIMIT_BYTES = LEDGER_LIMIT_BYTES
MAX_PIECES = 4_096
# Objects under the pieces' prefix that are no piece of the run, read before giving up on a fold's
# or a read's wanted pieces: planted ones cost at most this many GETs.
READ_TRIES = 64
# A fold takes the writer's own piece and at most this many others, so that a thousand writers
# ending at once do not each read a thousand pieces; what is left is folded by later writers.
FOLD_OTHERS = 8
# Tries of one fold; each lost race waits a random time up to a doubling cap (full jitter).
FOLD_TRIES = 4
FOLD_PAUSE_S = 0.1
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
        # The pieces before ledger.json: a piece gone by the time it is read was folded into a
        # ledger.json at least as new as the one read after it.
        pieces = [piece for _key, piece in self._pieces(run_id, runs_prefix, wanted=MAX_PIECES)]
        found = self._get(runs_prefix + LEDGER_FILE, LEDGER_LIMIT_BYTES)
        current = None if found is None else parse_ledger(found[0], self.location(run_id, runs_prefix))
        # What was folded wins over a piece of the same attempt: a planted piece overrides nothing.
        return _merged(_merged(None, pieces, run_id), [] if current is None else [current], run_id)

    def update(self, run_id: str, runs_prefix: str, change: Change) -> Ledger:
        """``change`` applied to no ledger is this attempt's piece: written first as its own object,
        then folded into ``ledger.json``. Returns the ledger as this writer last saw it, its piece in."""
        own = change(None)
        own_key = f"{runs_prefix}{PIECES}{uuid.uuid4().hex}.json"
        self._put(own_key, own, condition={"IfNoneMatch": "*"})
        where = self.location(run_id, runs_prefix)
        # Pieces never change: listed once, and folding one twice adds nothing.
        others = [
            (key, piece)
            for key, piece in self._pieces(run_id, runs_prefix, wanted=FOLD_OTHERS + 1)
            if key != own_key
        ][:FOLD_OTHERS]
        seen = own
        for attempt in range(FOLD_TRIES):
            found = self._get(runs_prefix + LEDGER_FILE, LEDGER_LIMIT_BYTES)
            current = None if found is None else parse_ledger(found[0], where)
            # This attempt's own entries last: a piece planted beforehand never replaces them.
            merged = _merged(current, [piece for _key, piece in others], run_id)
            seen = own if merged is None else _added(merged, [own], run_id)
            condition = {"IfNoneMatch": "*"} if found is None else {"IfMatch": found[1]}
            try:
                self._put(runs_prefix + LEDGER_FILE, seen, condition=condition)
            except _RaceLostError:
                time.sleep(random.uniform(0, FOLD_PAUSE_S * 2**attempt))  # noqa: S311 - spreading retries
                continue
            for key in (own_key, *(key for key, _piece in others)):
                self._delete(key)
            return seen
        return seen  # the piece stays: readers take it, and a later writer folds it

    def _put(self, key: str, ledger: Ledger, *, condition: dict[str, Any]) -> None:
        body = dumps_ledger(ledger, now=self._clock.wall())
        digest = hashlib.sha256(body)
        args: dict[str, Any] = {
            **write_args(self._settings, digest.hexdigest()),
            "ChecksumSHA256": b64_digest(digest.digest()),  # the store verifies the bytes
            "ContentType": "application/json",
        }
        try:
            self._client.put_object(Bucket=self._bucket, Key=key, Body=body, **condition, **args)
        except BotoErrors as exc:
            if is_precondition_failed(exc) or is_conditional_conflict(exc):
                raise _RaceLostError from exc
            raise UploadError(
                f"cannot write s3://{self._bucket}/{key}: {describe(exc, self._settings)}"
            ) from exc

    def _pieces(self, run_id: str, runs_prefix: str, *, wanted: int) -> list[tuple[str, Ledger]]:
        """The oldest ``wanted`` pieces of this run not yet folded. Anything else under the prefix
        (damaged, too large by its listed size, another run's, unreadable, gone meanwhile) is
        passed over, at most READ_TRIES of them read; ConfigError when the pieces of this run
        exceed a ledger's bytes or MAX_PIECES are listed: a read never silently drops one."""
        listed: list[tuple[float, str, int]] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self._bucket, Prefix=runs_prefix + PIECES
            )
            for page in pages:
                contents = page.get("Contents", [])
                listed += [(item["LastModified"].timestamp(), item["Key"], item["Size"]) for item in contents]
                if len(listed) > MAX_PIECES:
                    raise ConfigError(
                        f"more than {MAX_PIECES} ledger pieces under s3://{self._bucket}/{runs_prefix}"
                    )
        except BotoErrors as exc:
            raise UploadError(
                f"cannot list s3://{self._bucket}/{runs_prefix}{PIECES}: {describe(exc, self._settings)}"
            ) from exc
        pieces: list[tuple[str, Ledger]] = []
        budget, tries = PIECES_LIMIT_BYTES, wanted + READ_TRIES
        for _modified, key, size in sorted(listed):
            if len(pieces) >= wanted or tries <= 0:
                break
            if size > PIECE_LIMIT_BYTES:
                continue  # not one of ours: never read, never folded, never deleted
            tries -= 1
            piece = self._piece(key, run_id)
            if piece is None:
                continue
            budget -= size
            if budget < 0:
                where = f"s3://{self._bucket}/{runs_prefix}{PIECES}"
                raise ConfigError(f"the ledger pieces under {where} exceed {PIECES_LIMIT_BYTES} bytes")
            pieces.append((key, piece))
        return pieces

    def _piece(self, key: str, run_id: str) -> Ledger | None:
        """The piece at ``key`` if it is one of this run's; None for anything else anyone who can
        write the bucket could have put there (a 4xx answer such as a customer key is one)."""
        try:
            found = self._get(key, PIECE_LIMIT_BYTES)
            piece = None if found is None else parse_ledger(found[0], key)
        except UploadError as exc:
            status = http_status(exc.__cause__) if exc.__cause__ is not None else 0
            if 400 <= status < 500 and status != 429:
                return None
            raise
        except ConfigError:
            return None
        return piece if piece is not None and piece.run_id == run_id else None

    def _delete(self, key: str) -> None:
        # Folded already: a piece left behind is read again, and changes nothing.
        with contextlib.suppress(*BotoErrors):
            self._client.delete_object(Bucket=self._bucket, Key=key)

    def _get(self, key: str, limit: int) -> tuple[bytes, str] | None:
        """(bytes, ETag) of the object, None when there is none."""
        try:
            answer = self._client.get_object(Bucket=self._bucket, Key=key)
            with answer["Body"] as body:
                data: bytes = body.read(limit + 1)
        except BotoErrors as exc:
            if is_not_found(exc):
                return None
            raise UploadError(
                f"cannot read s3://{self._bucket}/{key}: {describe(exc, self._settings)}"
            ) from exc
        return data, str(answer["ETag"])


class _RaceLostError(Exception):
    """Another writer changed the object between our read and our conditional write."""


def _merged(current: Ledger | None, pieces: list[Ledger], run_id: str) -> Ledger | None:
    """``current`` with every entry of ``pieces`` added; None when there is neither."""
    if current is None:
        if not pieces:
            return None
        current, pieces = pieces[0], pieces[1:]
    return _added(current, pieces, run_id)


def _added(base: Ledger, pieces: list[Ledger], run_id: str) -> Ledger:
    """``base`` with every entry of ``pieces`` added (the rules of one attempt adding its own)."""
    for piece in pieces:
        for entry in piece.entries:
            started = piece.deadline_started_unix
            base = with_entry(base, entry, run_id=run_id, deadline_started_unix=started)
    return base


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
        fd, _ = open_regular(path)
    except FileNotFoundError:
        return None
    except UnsafeFileError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    try:
        return read_up_to(fd, LEDGER_LIMIT_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    finally:
        os.close(fd)
