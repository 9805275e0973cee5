"""The supervisor lock as a lease object in the bucket: acquire, renew on a thread, take over a
stale one, release (the semantics are in the package's docstring)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
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
    describe,
    is_not_found,
    is_precondition_failed,
    retry_conflicts,
)
from sidecar.adapters.s3_store.objects import checksum, store_error
from sidecar.core.errors import AlreadySupervisedError, SoakError
from sidecar.core.ports import Clock
from sidecar.settings import S3Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)

# A lease is a few hundred bytes; anything larger is not ours and is only shown truncated.
_MAX_LEASE_BYTES = 64 * 1024


class SystemClock:
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
    # Taken over or not renewed in time (reported once through on_lock_lost): no longer ours.
    lost: bool = False
    stop: threading.Event = field(default_factory=threading.Event)


class LeaseLock:
    """The leases this process holds in ``bucket``; ``on_lock_lost`` is called once per lost one."""

    def __init__(
        self,
        client: S3Client,
        bucket: str,
        settings: S3Settings,
        *,
        clock: Clock,
        on_lock_lost: Callable[[str], None] | None,
    ) -> None:
        self._client = client
        self._bucket = bucket
        self._settings = settings
        self._clock = clock
        self._on_lock_lost = on_lock_lost
        self._leases: dict[str, _Lease] = {}

    @contextlib.contextmanager
    def lock(self, slot: str, key: str) -> Iterator[None]:
        if slot in self._leases:
            raise AlreadySupervisedError(f"run {slot} is already locked by this process")
        lease = self._acquire(slot, key)
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
                ChecksumSHA256=checksum(body),
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

    def _acquire(self, run_id: str, key: str) -> _Lease:
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
            raise store_error(exc, f"cannot take the supervisor lock {uri}", self._settings) from exc

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
        lease.lost = True
        log.error("supervisor lock lost: %s", reason)
        if self._on_lock_lost is not None:
            self._on_lock_lost(reason)

    def _release(self, lease: _Lease) -> None:
        if lease.lost:
            return  # not ours any more: deleting would remove the new owner's lease
        try:
            self._client.delete_object(Bucket=self._bucket, Key=lease.key, IfMatch=lease.etag)
        except BotoErrors as exc:
            # Harmless: the next supervisor takes a stale lease over after lock_lease_s.
            log.warning("could not delete the lease %s: %s", lease.key, describe(exc, self._settings))


def _holder(note: dict[str, Any]) -> str:
    if not note:
        return "holder unknown"
    return f"held by pid {note.get('pid')} on {note.get('host')}, lease seq {note.get('seq')}"
