"""Know an S3 store before trusting it: a few requests under the run's prefix that show whether it
honours conditional writes and checks and echoes SHA-256 checksums (``sidecar.core.store_features``).

Once per endpoint and bucket per process (cached): a sidecar process runs one attempt, so that is
once per attempt. The requests, in order, on two throwaway keys ``<prefix>probe-<token>`` and
``...-checksum``:

1. PutObject If-None-Match: * with the body's SHA-256 (creates the key; its answer echoes the checksum);
2. the same again (must fail, 412);
3. PutObject If-Match: <a wrong ETag> (must fail, 412);
4. CreateMultipartUpload, UploadPart, CompleteMultipartUpload If-None-Match: * (must fail, 412),
   AbortMultipartUpload;
5. DeleteObject If-Match: <a wrong ETag> (must fail, 412);
6. PutObject of the second key with a SHA-256 that does not match its body (must fail, BadDigest);
7. DeleteObject of the probe key (and of the second key, when a store took it).

Eleven requests, ten when the store refuses the bad checksum. A store that ignores a condition
may have overwritten or removed the probe key on the way: only throwaway keys are touched.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import botocore.exceptions

from sidecar.adapters.s3_client import (
    CHECKSUM_CODES,
    ClientFactory,
    S3Stats,
    b64_digest,
    build_client,
    error_code,
    http_status,
    is_precondition_failed,
    make_s3_client,
)
from sidecar.adapters.s3_store.objects import store_error
from sidecar.core.errors import ConfigError
from sidecar.core.identity import parse_slot
from sidecar.core.store_features import StoreFeatures, store_refusal
from sidecar.settings import S3Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedMultipartUploadTypeDef

PROBE_BODY = b"soak-sidecar store probe: throwaway, safe to delete"
# An ETag no object has: a conditional write on it must fail.
WRONG_ETAG = '"00000000000000000000000000000000"'

_cache: dict[tuple[str, str], StoreFeatures] = {}
_cache_lock = threading.Lock()


class S3StoreCheck:
    """The run's store checked before its first lock or claim (``StoreCheck``): under
    ``<deadline_prefix>/<slot>.probe/``."""

    def __init__(self, settings: S3Settings, *, client_factory: ClientFactory = make_s3_client) -> None:
        self._settings = settings
        self._client_factory = client_factory

    def check(self, slot: str) -> StoreFeatures:
        client, _ = build_client(self._settings, self._client_factory)
        prefix = f"{self._settings.deadline_prefix.strip('/')}/{parse_slot(slot)}.probe/"
        return trusted_store(client, self._settings, prefix)


class StoreCapabilityError(ConfigError):
    """The store lacks what the run relies on: configuration, not the trainer (exit 64)."""


def trusted_store(client: S3Client, settings: S3Settings, key_prefix: str) -> StoreFeatures:
    """The store's features, probed once per endpoint and bucket in this process; raises
    StoreCapabilityError for a store the run cannot rely on, and the store's own errors
    (ConfigError, StoreUnavailableError) when it cannot be asked."""
    features = probed(client, settings, key_prefix)
    refusal = store_refusal(features, accept_unverified=settings.accept_unverified_checksums)
    if refusal is not None:
        raise StoreCapabilityError(refusal)
    return features


def probed(client: S3Client, settings: S3Settings, key_prefix: str) -> StoreFeatures:
    bucket = settings.bucket or ""
    place = (settings.endpoint_url or "AWS", bucket)
    with _cache_lock:
        known = _cache.get(place)
        if known is None:
            known = probe_store(client, settings, key_prefix)
            _cache[place] = known
    return known


def probe_store(client: S3Client, settings: S3Settings, key_prefix: str) -> StoreFeatures:
    """One probe, its requests counted and timed (``probed`` keeps the first per endpoint and bucket)."""
    bucket = settings.bucket or ""
    key = f"{key_prefix}probe-{secrets.token_hex(8)}"
    stats = S3Stats()
    stats.attach(client)
    began = time.monotonic()
    try:
        features = _Probe(client, bucket, key).run()
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError, OSError) as exc:
        raise store_error(exc, f"cannot probe the S3 store at s3://{bucket}/{key}", settings) from exc
    finally:
        stats.detach(client)
    return StoreFeatures(
        endpoint=settings.endpoint_url or "AWS",
        bucket=bucket,
        requests=stats.attempts,
        elapsed_ms=(time.monotonic() - began) * 1000,
        **features,
    )


class _Probe:
    def __init__(self, client: S3Client, bucket: str, key: str) -> None:
        self._client, self._bucket, self._key = client, bucket, key
        self._sha = b64_digest(hashlib.sha256(PROBE_BODY).digest())

    def run(self) -> dict[str, bool]:
        created = self._put(IfNoneMatch="*")
        checksum_key = f"{self._key}-checksum"
        try:
            found = {
                "checksum_echoed": created.get("ChecksumSHA256") == self._sha,
                "conditional_create": _refused(lambda: self._put(IfNoneMatch="*")),
                "conditional_put": _refused(lambda: self._put(IfMatch=WRONG_ETAG)),
                "conditional_complete": self._complete_refused(),
                "conditional_delete": _refused(
                    lambda: self._client.delete_object(Bucket=self._bucket, Key=self._key, IfMatch=WRONG_ETAG)
                ),
            }
            found["checksum_checked"] = self._bad_checksum_refused(checksum_key)
        finally:
            self._client.delete_object(Bucket=self._bucket, Key=self._key)
        return found

    def _put(self, **condition: Any) -> Any:
        return self._client.put_object(
            Bucket=self._bucket, Key=self._key, Body=PROBE_BODY, ChecksumSHA256=self._sha, **condition
        )

    def _complete_refused(self) -> bool:
        created = self._client.create_multipart_upload(Bucket=self._bucket, Key=self._key)
        upload_id = created["UploadId"]
        try:
            part = self._client.upload_part(
                Bucket=self._bucket, Key=self._key, UploadId=upload_id, PartNumber=1, Body=PROBE_BODY
            )
            parts: CompletedMultipartUploadTypeDef = {"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}
            return _refused(
                lambda: self._client.complete_multipart_upload(
                    Bucket=self._bucket,
                    Key=self._key,
                    UploadId=upload_id,
                    MultipartUpload=parts,
                    IfNoneMatch="*",
                )
            )
        finally:
            # Left by a refused completion; gone already after one the store accepted.
            _quietly(
                lambda: self._client.abort_multipart_upload(
                    Bucket=self._bucket, Key=self._key, UploadId=upload_id
                )
            )

    def _bad_checksum_refused(self, key: str) -> bool:
        wrong = b64_digest(hashlib.sha256(PROBE_BODY + b"!").digest())
        try:
            self._client.put_object(Bucket=self._bucket, Key=key, Body=PROBE_BODY, ChecksumSHA256=wrong)
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) in CHECKSUM_CODES or http_status(exc) == 400:
                return True
            raise
        self._client.delete_object(Bucket=self._bucket, Key=key)
        return False


def _refused(call: Callable[[], object]) -> bool:
    """Whether the store refused a conditional request with 412, as S3 does."""
    try:
        call()
    except botocore.exceptions.ClientError as exc:
        if is_precondition_failed(exc):
            return True
        raise
    return False


def _quietly(call: Callable[[], object]) -> None:
    # An upload left behind costs storage only: a bucket lifecycle rule removes it.
    with contextlib.suppress(botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError):
        call()
