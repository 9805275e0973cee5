"""Deadline records and the attempt ledger in an S3 bucket; the supervisor lock is a lease
(``lease``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
from collections.abc import Callable

import botocore.exceptions

from sidecar.adapters.s3_client import (
    ClientFactory,
    build_client,
    is_not_found,
    is_precondition_failed,
    make_s3_client,
    retry_conflicts,
)
from sidecar.adapters.s3_store.lease import LeaseLock, SystemClock
from sidecar.adapters.s3_store.objects import checksum, store_error
from sidecar.core.boot import StoreClock
from sidecar.core.deadline import MAX_ATTEMPTS, MAX_RECORD_BYTES
from sidecar.core.errors import (
    ConfigError,
    DeadlineRecordError,
    RecordExistsError,
    SoakError,
    StoreUnavailableError,
)
from sidecar.core.identity import parse_run_id, parse_slot
from sidecar.core.ports import Clock
from sidecar.settings import S3Settings


def s3_store_location(bucket: str, deadline_prefix: str) -> str:
    """What names the S3 deadline store in a run's identity and approval (no connection needed)."""
    return f"s3://{bucket}/{deadline_prefix.strip('/')}/"


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
        self._client, _ = build_client(settings, client_factory)
        self._leases = LeaseLock(
            self._client, self._bucket, settings, clock=clock or SystemClock(), on_lock_lost=on_lock_lost
        )

    @property
    def location(self) -> str:
        return s3_store_location(self._bucket, self._settings.deadline_prefix)

    def record_key(self, run_id: str) -> str:
        # parse_run_id admits only UUIDs, so the key can never leave the prefix.
        return f"{self._prefix}/{parse_run_id(run_id)}.json"

    def lock_key(self, slot: str) -> str:
        return f"{self._prefix}/{parse_slot(slot)}.lock"

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
        digest = checksum(payload)
        try:
            retry_conflicts(
                lambda: self._client.put_object(
                    Bucket=self._bucket,
                    Key=key,
                    Body=payload,
                    ChecksumSHA256=digest,
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
        if stored is None:
            raise DeadlineRecordError(f"deadline record {uri} was created but cannot be read back")
        if stored != payload:
            # Another writer's bytes under a create the store said was ours: the condition was not kept.
            raise DeadlineRecordError(
                f"the store answered the conditional create (If-None-Match: *) of {uri} with success, "
                f"but the key holds other bytes ({len(payload)} written, {len(stored)} read): it does not "
                "honour conditional writes, and one supervisor per run cannot be promised on it"
            )

    def _put_new(self, key: str, data: bytes) -> None:
        retry_conflicts(
            lambda: self._client.put_object(
                Bucket=self._bucket,
                Key=key,
                Body=data,
                ChecksumSHA256=checksum(data),
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
        """The ledger of every slot of the run (its own, each index's): when the server stored each
        claim (LastModified, from the listing alone). Reading each claim's body instead cost every
        index one GET per claim already made: a million GETs when 1,024 indexes start at once. The
        server's clock is also the one a node's own is held to (``store_clock``)."""
        prefix = f"{self._prefix}/{parse_run_id(run_id)}."
        uri = f"s3://{self._bucket}/{prefix}*.attempts/"
        try:
            claims: list[float | None] = []
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self._bucket, Prefix=prefix)
            for page in pages:
                contents = page.get("Contents", [])
                claims += [
                    item["LastModified"].timestamp() for item in contents if _is_claim(item["Key"], prefix)
                ]
                if len(claims) > MAX_ATTEMPTS * 8:
                    break  # far beyond any real ledger: what is listed suffices to refuse
            return claims
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError, OSError) as exc:
            raise self._error(exc, f"cannot read the attempt ledger {uri}") from exc

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

    def lock(self, slot: str) -> contextlib.AbstractContextManager[None]:
        """The supervisor lock of ``slot``: a lease object in the bucket, held while the context runs."""
        return self._leases.lock(slot, self.lock_key(slot))

    def _error(self, exc: BaseException, what: str) -> SoakError:
        return store_error(exc, what, self._settings)


_CLAIM = re.compile(r"(?:index-(?:0|[1-9][0-9]*)\.)?attempts/[0-9]+")


def _is_claim(key: str, run_prefix: str) -> bool:
    """``<run_id>.attempts/<n>`` or ``<run_id>.index-<i>.attempts/<n>``, with ``run_prefix`` the
    ``<deadline_prefix>/<run_id>.`` before them."""
    return key.startswith(run_prefix) and _CLAIM.fullmatch(key[len(run_prefix) :]) is not None
