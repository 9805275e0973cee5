"""Deadline records and the supervisor lock in an S3 bucket (``DeadlineStore``).

Layout under ``s3://<bucket>/<deadline_prefix>/``: ``<run_id>.json`` (the record, created once
with ``If-None-Match: *`` and never rewritten), ``<slot>.lock`` (the supervisor's lease) and
``<slot>.attempts/<n>`` (the attempt ledger); a slot is the run id, or ``<run_id>.index-<n>`` for one
pod of a multi-pod soak (every index shares the run's record).

Lock semantics. S3 has no locks, so the lock is a lease object:

- acquire: PutObject ``If-None-Match: *`` with a fresh owner token. If the lease exists, the
  waiter watches its ETag. A change means a live owner renewing it: ``AlreadySupervisedError``.
  No change for ``lock_lease_s`` on the waiter's own monotonic clock means the owner is gone,
  and the waiter takes the lease over with ``If-Match: <that ETag>`` (at most one taker wins).
  No wall-clock comparison across machines is involved, so clock skew cannot cause a takeover.
  The price: a supervisor replacing a crashed one waits up to ``lock_lease_s``, and a duplicate
  supervisor is refused only once it sees a renewal (up to ``lock_renew_interval_s``).
- hold: a daemon thread renews every ``lock_renew_interval_s`` with ``If-Match`` on the last
  ETag. A 412 (taken over) or no successful renewal for ``lock_lease_s`` counted from the send
  time of the last good one (a waiter may take over from then on) means the lease is lost:
  ``on_lock_lost`` is called once and ``lock_lost`` says why; the caller must stop the trainer.
- release: DeleteObject ``If-Match: <our ETag>``; a failure leaves a lease that the next
  supervisor takes over after ``lock_lease_s``.

Limits: correctness needs a store that honours ``If-None-Match``/``If-Match`` on PutObject and
DeleteObject (AWS S3, SeaweedFS); a store that silently ignores them gives no mutual exclusion.
Time spent paused (SIGSTOP, VM freeze) beyond the lease is indistinguishable from a crash.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import botocore.exceptions

from sidecar.adapters.s3_client import (
    BotoErrors,
    ClientFactory,
    b64_digest,
    build_client,
    describe,
    is_auth_failure,
    is_not_found,
    is_precondition_failed,
    make_s3_client,
    retry_conflicts,
)
from sidecar.core.boot import StoreClock
from sidecar.core.deadline import MAX_ATTEMPTS, MAX_RECORD_BYTES
from sidecar.core.errors import (
    AlreadySupervisedError,
    ConfigError,
    DeadlineRecordError,
    RecordExistsError,
    SoakError,
    StoreUnavailableError,
)
from sidecar.core.identity import parse_run_id, parse_slot
from sidecar.core.ports import Clock
from sidecar.settings import S3Settings

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

# A lease is a few hundred bytes; anything larger is not ours and is only shown truncated.
_MAX_LEASE_BYTES = 64 * 1024


class _SystemClock:
    def wall(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


@dataclass
class _Lease:
    run_id: str
    key: str
    token: str
    etag: str
    acquired_unix: float
    last_ok_sent: float  # monotonic send time of the last successful write
    seq: int = 0
    lost: str | None = None
    stop: threading.Event = field(default_factory=threading.Event)


class S3DeadlineStore:
    """``DeadlineStore`` on an S3-compatible bucket (``settings.bucket`` must be set)."""

    def __init__(
        self,
        settings: S3Settings,
        *,
        client_factory: ClientFactory = make_s3_client,
        clock: Clock | None = None,
        on_lock_lost: Callable[[str], None] | None = None,
    ) -> None:
        if not settings.bucket:
            raise ConfigError("the S3 deadline store needs s3.bucket")
        self._settings = settings
        self._bucket: str = settings.bucket
        self._prefix = settings.deadline_prefix.strip("/")
        self._clock: Clock = clock or _SystemClock()
        self._on_lock_lost = on_lock_lost
        self._leases: dict[str, _Lease] = {}
        self._client, self.stats = build_client(settings, client_factory)

    @property
    def location(self) -> str:
        return f"s3://{self._bucket}/{self._prefix}/"

    def record_key(self, run_id: str) -> str:
        # parse_run_id admits only UUIDs, so the key can never leave the prefix.
        return f"{self._prefix}/{parse_run_id(run_id)}.json"

    def lock_key(self, slot: str) -> str:
        return f"{self._prefix}/{parse_slot(slot)}.lock"

    def lock_lost(self, slot: str) -> str | None:
        """Why the lease of a held lock was lost, or None while it is held."""
        lease = self._leases.get(slot)
        return None if lease is None else lease.lost

    # -- records ------------------------------------------------------------------------------

    def load(self, run_id: str) -> bytes | None:
        key = self.record_key(run_id)
        try:
            answer = self._client.get_object(Bucket=self._bucket, Key=key)
            body = answer["Body"]
            try:
                # One byte over the cap is enough for the parser to refuse it.
                return body.read(MAX_RECORD_BYTES + 1)
            finally:
                body.close()
        except botocore.exceptions.ClientError as exc:
            if is_not_found(exc):
                return None
            raise self._error(exc, f"cannot read deadline record s3://{self._bucket}/{key}") from exc
        except (botocore.exceptions.BotoCoreError, OSError) as exc:
            raise self._error(exc, f"cannot read deadline record s3://{self._bucket}/{key}") from exc

    def create(self, run_id: str, payload: bytes) -> None:
        """Exclusive create, then read back and compare (a store that mangles bytes fails closed).

        If botocore retried a PUT whose first attempt had landed, the retry meets 412 and this
        raises RecordExistsError; the caller then loads the (identical) record and resumes it.
        """
        key = self.record_key(run_id)
        uri = f"s3://{self._bucket}/{key}"
        checksum = b64_digest(_sha256(payload))
        try:
            retry_conflicts(
                lambda: self._client.put_object(
                    Bucket=self._bucket,
                    Key=key,
                    Body=payload,
                    ChecksumSHA256=checksum,
                    ContentType="application/json",
                    IfNoneMatch="*",
                )
            )
        except botocore.exceptions.ClientError as exc:
            if is_precondition_failed(exc):
                raise RecordExistsError(f"deadline record {uri} already exists") from exc
            raise self._error(exc, f"cannot create deadline record {uri}") from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise self._error(exc, f"cannot create deadline record {uri}") from exc
        stored = self.load(run_id)
        if stored != payload:
            raise DeadlineRecordError(
                f"deadline record {uri} reads back differently from what was written "
                f"({len(payload)} bytes written, {None if stored is None else len(stored)} read)"
            )

    def _put_new(self, key: str, data: bytes) -> None:
        retry_conflicts(
            lambda: self._client.put_object(
                Bucket=self._bucket,
                Key=key,
                Body=data,
                ChecksumSHA256=b64_digest(_sha256(data)),
                IfNoneMatch="*",
            )
        )

    def store_clock(self, run_id: str) -> StoreClock | None:
        """The S3 server's time: the record object's LastModified, and that of a probe object put
        now (``<run_id>.clock``, overwritten each time). A node whose clock is behind the server's
        cannot gain time with it."""
        record, probe = self.record_key(run_id), f"{self._prefix}/{parse_run_id(run_id)}.clock"
        uri = f"s3://{self._bucket}/{self._prefix}/"
        try:
            written = self._client.head_object(Bucket=self._bucket, Key=record)["LastModified"]
            self._client.put_object(Bucket=self._bucket, Key=probe, Body=b"now")
            now = self._client.head_object(Bucket=self._bucket, Key=probe)["LastModified"]
        except botocore.exceptions.ClientError as exc:
            if is_not_found(exc):
                return None
            raise self._error(exc, f"cannot read the S3 server's clock at {uri}") from exc
        except (botocore.exceptions.BotoCoreError, OSError) as exc:
            raise self._error(exc, f"cannot read the S3 server's clock at {uri}") from exc
        return StoreClock(
            record_written=written.timestamp(),
            now=now.timestamp(),
            source="the deadline store's clock (S3 LastModified)",
        )

    def attempt_claims(self, run_id: str) -> list[float | None]:
        """The ledger of every slot of the run (its own, each index's): each claim's ``claimed_unix``
        as its claimer wrote it (None when unreadable)."""
        prefix = f"{self._prefix}/{parse_run_id(run_id)}."
        uri = f"s3://{self._bucket}/{prefix}*.attempts/"
        try:
            keys: list[str] = []
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self._bucket, Prefix=prefix)
            for page in pages:
                keys += [item["Key"] for item in page.get("Contents", []) if _is_claim(item["Key"], prefix)]
                if len(keys) > MAX_ATTEMPTS * 8:
                    break  # far beyond any real ledger: what is listed suffices to refuse
            return [self._claimed_unix(key) for key in keys]
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError, OSError) as exc:
            raise self._error(exc, f"cannot read the attempt ledger {uri}") from exc

    def _claimed_unix(self, key: str) -> float | None:
        body = self._client.get_object(Bucket=self._bucket, Key=key)["Body"]
        try:
            claimed = json.loads(body.read(4096)).get("claimed_unix")
        except (ValueError, AttributeError):
            return None
        finally:
            body.close()
        return float(claimed) if isinstance(claimed, (int, float)) and not isinstance(claimed, bool) else None

    def claim_attempt(self, slot: str) -> int:
        """``<slot>.attempts/<n>``, the first n whose conditional create (If-None-Match) wins.

        A botocore retry of a PUT that had landed meets 412 and moves on to n+1: a gap in the
        numbering, never a shared number.
        """
        prefix = f"{self._prefix}/{parse_slot(slot)}.attempts"
        body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "claimed_unix": time.time()})
        for attempt in range(1, MAX_ATTEMPTS + 1):
            key = f"{prefix}/{attempt}"
            try:
                self._put_new(key, body.encode())
            except botocore.exceptions.ClientError as exc:
                if is_precondition_failed(exc):
                    continue
                raise self._error(exc, f"cannot claim attempt s3://{self._bucket}/{key}") from exc
            except botocore.exceptions.BotoCoreError as exc:
                raise self._error(exc, f"cannot claim attempt s3://{self._bucket}/{key}") from exc
            return attempt
        raise StoreUnavailableError(f"more than {MAX_ATTEMPTS} attempts under s3://{self._bucket}/{prefix}/")

    # -- lock ---------------------------------------------------------------------------------

    def inheritable_lock_fd(self, slot: str) -> int | None:
        """A lease object is no descriptor: nothing to inherit (its loss kills the trainer instead)."""
        return None

    @contextlib.contextmanager
    def lock(self, slot: str) -> Iterator[None]:
        if slot in self._leases:
            raise AlreadySupervisedError(f"run {slot} is already locked by this process")
        lease = self._acquire(slot)
        self._leases[slot] = lease
        renewer = threading.Thread(
            target=self._renew_loop, args=(lease,), name=f"s3-lease-{slot[:8]}", daemon=True
        )
        renewer.start()
        try:
            yield
        finally:
            lease.stop.set()
            renewer.join(timeout=self._settings.lock_lease_s)
            del self._leases[slot]
            self._release(lease)

    def _lease_body(self, lease: _Lease) -> bytes:
        now = self._clock.wall()
        note = {
            "protocol": 1,
            "run_id": lease.run_id,
            "owner": lease.token,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "acquired_unix": lease.acquired_unix,
            "renewed_unix": now,
            "lease_s": self._settings.lock_lease_s,
            "seq": lease.seq,
        }
        return json.dumps(note, sort_keys=True).encode()

    def _put_lease(self, lease: _Lease, **condition: str) -> str:
        """Write the lease under ``condition`` (IfNoneMatch or IfMatch); returns the new ETag."""
        body = self._lease_body(lease)
        answer = retry_conflicts(
            lambda: self._client.put_object(
                Bucket=self._bucket,
                Key=lease.key,
                Body=body,
                ChecksumSHA256=b64_digest(_sha256(body)),
                ContentType="application/json",
                **condition,  # type: ignore[arg-type]
            )
        )
        return answer["ETag"]

    def _read_lease(self, key: str) -> tuple[str, dict[str, Any]] | None:
        """(ETag, parsed note) of the current lease, or None when there is none."""
        try:
            answer = self._client.get_object(Bucket=self._bucket, Key=key)
            body = answer["Body"]
            try:
                raw = body.read(_MAX_LEASE_BYTES)
            finally:
                body.close()
        except botocore.exceptions.ClientError as exc:
            if is_not_found(exc):
                return None
            raise
        try:
            note = json.loads(raw)
        except ValueError:
            note = {}
        # Any object at the key is a lease, even an unreadable one: its ETag is what we watch.
        return answer["ETag"], note if isinstance(note, dict) else {}

    def _acquire(self, run_id: str) -> _Lease:
        key = self.lock_key(run_id)
        uri = f"s3://{self._bucket}/{key}"
        lease = _Lease(
            run_id=run_id,
            key=key,
            token=uuid.uuid4().hex,
            etag="",
            acquired_unix=self._clock.wall(),
            last_ok_sent=self._clock.monotonic(),
        )
        poll = min(1.0, self._settings.lock_renew_interval_s / 2)
        watched: tuple[str, float] | None = None  # (ETag, first seen on our monotonic clock)
        try:
            while not self._create_lease(lease):
                current = self._read_lease(key)
                if current is None:
                    continue  # released between our PUT and GET: try to create it again
                etag, note = current
                now = self._clock.monotonic()
                if watched is None:
                    watched = (etag, now)
                elif watched[0] != etag:
                    raise AlreadySupervisedError(
                        f"another supervisor holds run {run_id} and renews its lease ({uri}; {_holder(note)})"
                    )
                elif now - watched[1] >= self._settings.lock_lease_s:
                    self._take_over(lease, etag, uri, note)
                    return lease
                time.sleep(poll)
            return lease
        except SoakError:
            raise
        except BotoErrors as exc:
            raise self._error(exc, f"cannot take the supervisor lock {uri}") from exc

    def _create_lease(self, lease: _Lease) -> bool:
        """Create the lease object unless one exists (then False)."""
        sent = self._clock.monotonic()
        try:
            lease.etag = self._put_lease(lease, IfNoneMatch="*")
        except botocore.exceptions.ClientError as exc:
            if not is_precondition_failed(exc):
                raise
            return False
        lease.last_ok_sent = sent
        return True

    def _take_over(self, lease: _Lease, stale_etag: str, uri: str, note: dict[str, Any]) -> None:
        """Replace the stale lease only if it is still the one watched: of two takers, one wins."""
        log.warning("taking over the stale lease %s (%s)", uri, _holder(note))
        sent = self._clock.monotonic()
        try:
            lease.etag = self._put_lease(lease, IfMatch=stale_etag)
        except botocore.exceptions.ClientError as exc:
            if is_precondition_failed(exc):
                raise AlreadySupervisedError(
                    f"another supervisor took over run {lease.run_id} first ({uri})"
                ) from exc
            raise
        lease.last_ok_sent = sent

    def _renew_loop(self, lease: _Lease) -> None:
        interval = self._settings.lock_renew_interval_s
        while not lease.stop.wait(interval):
            sent = self._clock.monotonic()
            lease.seq += 1
            try:
                lease.etag = self._put_lease(lease, IfMatch=lease.etag)
                lease.last_ok_sent = sent
            except botocore.exceptions.ClientError as exc:
                if is_precondition_failed(exc) or is_not_found(exc):
                    self._lose(lease, f"the lease s3://{self._bucket}/{lease.key} was taken over")
                    return
                log.warning("lease renewal failed, will retry: %s", describe(exc, self._settings))
            except botocore.exceptions.BotoCoreError as exc:
                log.warning("lease renewal failed, will retry: %s", describe(exc, self._settings))
            if self._clock.monotonic() - lease.last_ok_sent >= self._settings.lock_lease_s:
                self._lose(
                    lease,
                    f"the lease s3://{self._bucket}/{lease.key} could not be renewed for "
                    f"{self._settings.lock_lease_s:g}s; another supervisor may take over",
                )
                return

    def _lose(self, lease: _Lease, reason: str) -> None:
        lease.lost = reason
        log.error("supervisor lock lost: %s", reason)
        if self._on_lock_lost is not None:
            self._on_lock_lost(reason)

    def _release(self, lease: _Lease) -> None:
        if lease.lost is not None:
            return  # not ours any more: deleting would remove the new owner's lease
        try:
            self._client.delete_object(Bucket=self._bucket, Key=lease.key, IfMatch=lease.etag)
        except BotoErrors as exc:
            # Harmless: the next supervisor takes a stale lease over after lock_lease_s.
            log.warning("could not delete the lease %s: %s", lease.key, describe(exc, self._settings))

    # -- errors -------------------------------------------------------------------------------

    def _error(self, exc: BaseException, what: str) -> SoakError:
        """Credentials and a missing bucket are configuration; anything else may pass on retry."""
        text = f"{what}: {describe(exc, self._settings)}"
        if is_auth_failure(exc) or (
            isinstance(exc, botocore.exceptions.ClientError)
            and exc.response.get("Error", {}).get("Code") == "NoSuchBucket"
        ):
            return ConfigError(text)
        return StoreUnavailableError(text)


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _holder(note: dict[str, Any]) -> str:
    if not note:
        return "holder unknown"
    return f"held by pid {note.get('pid')} on {note.get('host')}, lease seq {note.get('seq')}"


_CLAIM = re.compile(r"(?:index-(?:0|[1-9][0-9]*)\.)?attempts/[0-9]+")


def _is_claim(key: str, run_prefix: str) -> bool:
    """``<run_id>.attempts/<n>`` or ``<run_id>.index-<i>.attempts/<n>``, with ``run_prefix`` the
    ``<deadline_prefix>/<run_id>.`` before them."""
    return key.startswith(run_prefix) and _CLAIM.fullmatch(key[len(run_prefix) :]) is not None
