"""Artifact upload to S3-compatible storage: checksummed, never overwriting.

Every object and every part carries a SHA-256 computed locally (``x-amz-checksum-sha256``), so
the server refuses bytes that changed on the way. Writes are conditional (``If-None-Match: *``
on PutObject and CompleteMultipartUpload): an existing key is never replaced. When a write meets
412 (the key exists, e.g. an earlier attempt or botocore's own retry got there first), the
stored object is verified by size and SHA-256 and accepted only if it holds our bytes.

Multipart is our own create/upload_part/complete loop (not boto3's transfer manager) so each
part carries its checksum and the completion is conditional; parts go out in parallel.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import botocore.exceptions

from sidecar.adapters.s3_client import (
    BotoErrors,
    ClientFactory,
    b64_digest,
    build_client,
    describe,
    is_not_found,
    is_precondition_failed,
    make_s3_client,
    retry_conflicts,
    write_args,
)
from sidecar.core.errors import ConfigError, ObjectConflictError, UploadError
from sidecar.core.keys import object_key
from sidecar.core.ports import UploadedObject
from sidecar.settings import S3Settings

if TYPE_CHECKING:
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

log = logging.getLogger(__name__)

_HASH_BLOCK = 1024 * 1024


@dataclass(frozen=True)
class _Digests:
    size: int
    sha256_hex: str
    full_b64: str
    # Composite checksum S3 reports for a multipart object: sha256 of the part digests + "-N".
    composite_b64: str | None
    part_b64: tuple[str, ...]


def _hash_file(path: Path, part_size: int | None) -> _Digests:
    """Whole-file sha256 and, for multipart, each part's sha256 (one read pass)."""
    whole = hashlib.sha256()
    parts: list[bytes] = []
    size = 0
    with path.open("rb") as handle:
        while True:
            block = handle.read(part_size or _HASH_BLOCK)
            if not block:
                break
            whole.update(block)
            size += len(block)
            if part_size:
                parts.append(hashlib.sha256(block).digest())
    return _Digests(
        size=size,
        sha256_hex=whole.hexdigest(),
        full_b64=b64_digest(whole.digest()),
        composite_b64=_composite(parts) if parts else None,
        part_b64=tuple(b64_digest(d) for d in parts),
    )


def _composite(part_digests: list[bytes]) -> str:
    return f"{b64_digest(hashlib.sha256(b''.join(part_digests)).digest())}-{len(part_digests)}"


class S3ArtifactSink:
    """``ArtifactSink`` on an S3-compatible bucket (``settings.bucket`` must be set)."""

    def __init__(self, settings: S3Settings, *, client_factory: ClientFactory = make_s3_client) -> None:
        if not settings.bucket:
            raise ConfigError("S3 upload needs s3.bucket")
        self._settings = settings
        self._bucket: str = settings.bucket
        self._client, self.stats = build_client(settings, client_factory)

    @property
    def location(self) -> str:
        return f"s3://{self._bucket}"

    def upload(self, files: Sequence[Path], key_prefix: str) -> list[UploadedObject]:
        """Upload ``files`` as ``<key_prefix><file name>``; every failure is an UploadError.

        Bad keys are UploadErrors too: the run is over by now, and its verdict must survive.
        """
        names = [path.name for path in files]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise UploadError(f"two artifact files share a name: {', '.join(duplicates)}")
        try:
            keys = [object_key(key_prefix, name) for name in names]
        except ConfigError as exc:
            raise UploadError(f"invalid artifact key: {exc}") from exc
        return [self._upload_one(path, key) for path, key in zip(files, keys, strict=True)]

    def upload_bytes(self, name: str, data: bytes, key_prefix: str) -> UploadedObject:
        """One small object (a segment, a provisional record) from memory: checksummed, never
        overwriting (an existing key is accepted only when it holds these bytes)."""
        try:
            key = object_key(key_prefix, name)
        except ConfigError as exc:
            raise UploadError(f"invalid artifact key: {exc}") from exc
        digest = hashlib.sha256(data)
        attempts_before = self.stats.attempts

        def put() -> bool:
            self._client.put_object(
                Bucket=self._bucket,
                Key=key,
                Body=data,
                ContentLength=len(data),
                ChecksumSHA256=b64_digest(digest.digest()),
                IfNoneMatch="*",
                **self._write_args(digest.hexdigest()),
            )
            return False

        try:
            try:
                present = retry_conflicts(put)
            except botocore.exceptions.ClientError as exc:
                if not is_precondition_failed(exc):
                    raise
                present = self._same_bytes(key, data, digest.hexdigest())
        except UploadError:
            raise
        except BotoErrors as exc:
            raise UploadError(
                f"upload of {name} to s3://{self._bucket}/{key} failed: "
                f"{describe(exc, self._settings, attempts=self.stats.attempts - attempts_before)}"
            ) from exc
        return UploadedObject(
            path=Path(name),
            uri=f"s3://{self._bucket}/{key}",
            sha256=digest.hexdigest(),
            size=len(data),
            parts=1,
            already_present=present,
        )

    def _same_bytes(self, key: str, data: bytes, sha256_hex: str) -> bool:
        """A key that exists already (a retry of our own PUT that landed): ours only if it holds ``data``."""
        body = self._client.get_object(Bucket=self._bucket, Key=key)["Body"]
        try:
            stored = body.read(len(data) + 1)
        finally:
            body.close()
        if hashlib.sha256(stored).hexdigest() != sha256_hex:
            raise ObjectConflictError(
                f"s3://{self._bucket}/{key} already exists with different content; nothing was overwritten"
            )
        return True

    # -- one object ---------------------------------------------------------------------------

    def _upload_one(self, path: Path, key: str) -> UploadedObject:
        attempts_before = self.stats.attempts
        try:
            if path.stat().st_size > self._settings.multipart_threshold_bytes:
                digests, parts, present = self._put_multipart(path, key)
            else:
                digests, parts, present = self._put_single(path, key)
        except UploadError:
            raise
        except BotoErrors as exc:
            raise UploadError(
                f"upload of {path.name} to s3://{self._bucket}/{key} failed: "
                f"{describe(exc, self._settings, attempts=self.stats.attempts - attempts_before)}"
            ) from exc
        except OSError as exc:
            raise UploadError(f"cannot read artifact file {path}: {exc}") from exc
        return UploadedObject(
            path=path,
            uri=f"s3://{self._bucket}/{key}",
            sha256=digests.sha256_hex,
            size=digests.size,
            parts=parts,
            already_present=present,
        )

    def _write_args(self, sha256_hex: str | None) -> dict[str, Any]:
        return write_args(self._settings, sha256_hex)

    def _put_single(self, path: Path, key: str) -> tuple[_Digests, int, bool]:
        """PutObject If-None-Match; ``present`` is True when the key already held our bytes."""
        digests = _hash_file(path, None)

        def put() -> bool:
            with path.open("rb") as body:
                self._client.put_object(
                    Bucket=self._bucket,
                    Key=key,
                    Body=body,
                    ContentLength=digests.size,
                    ChecksumSHA256=digests.full_b64,
                    IfNoneMatch="*",
                    **self._write_args(digests.sha256_hex),
                )
            return False

        try:
            return digests, 1, retry_conflicts(put)
        except botocore.exceptions.ClientError as exc:
            if is_precondition_failed(exc):
                return digests, 1, self._verify_existing(path, key, digests)
            raise

    def _put_multipart(self, path: Path, key: str) -> tuple[_Digests, int, bool]:
        """Parts hashed as they are read and sent, so the file is read once (no pre-pass).

        The whole-file sha256 is known only at the end, so it is not stored as metadata here;
        the server keeps the composite checksum it verified part by part.
        """
        chunk = self._settings.multipart_chunk_bytes
        # Cheap early exit: a retried attempt need not push gigabytes to learn the key is taken.
        if self._exists(key):
            digests = _hash_file(path, chunk)
            return digests, len(digests.part_b64), self._verify_existing(path, key, digests)
        created = self._client.create_multipart_upload(
            Bucket=self._bucket, Key=key, ChecksumAlgorithm="SHA256", **self._write_args(None)
        )
        upload_id = created["UploadId"]
        try:
            parts, digests = self._upload_parts(path, key, upload_id)
            try:
                result = retry_conflicts(
                    lambda: self._client.complete_multipart_upload(
                        Bucket=self._bucket,
                        Key=key,
                        UploadId=upload_id,
                        MultipartUpload={"Parts": parts},
                        IfNoneMatch="*",
                    )
                )
            except botocore.exceptions.ClientError as exc:
                if not is_precondition_failed(exc):
                    raise
                self._abort(key, upload_id)
                return digests, len(parts), self._verify_existing(path, key, digests)
        except BaseException:
            self._abort(key, upload_id)
            raise
        stored = result.get("ChecksumSHA256")
        if stored and stored not in (digests.composite_b64, digests.full_b64):
            raise UploadError(
                f"s3://{self._bucket}/{key}: the server's checksum {stored} differs from ours "
                f"{digests.composite_b64} after completing the upload"
            )
        return digests, len(parts), False

    def _upload_parts(
        self, path: Path, key: str, upload_id: str
    ) -> tuple[list[CompletedPartTypeDef], _Digests]:
        chunk = self._settings.multipart_chunk_bytes
        limit = self._settings.multipart_concurrency
        whole = hashlib.sha256()
        size = 0
        done: list[tuple[CompletedPartTypeDef, bytes]] = []
        pending: set[Future[tuple[CompletedPartTypeDef, bytes]]] = set()

        def send(number: int, data: bytes) -> tuple[CompletedPartTypeDef, bytes]:
            # Hashed here, in parallel with the reader's whole-file hash (hashlib drops the GIL).
            digest = hashlib.sha256(data).digest()
            checksum = b64_digest(digest)
            answer = self._client.upload_part(
                Bucket=self._bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                Body=data,
                ContentLength=len(data),
                ChecksumAlgorithm="SHA256",
                ChecksumSHA256=checksum,
            )
            part: CompletedPartTypeDef = {
                "PartNumber": number,
                "ETag": answer["ETag"],
                "ChecksumSHA256": checksum,
            }
            return part, digest

        with ThreadPoolExecutor(max_workers=limit, thread_name_prefix="s3-part") as pool:
            try:
                with path.open("rb") as handle:
                    number = 0
                    while data := handle.read(chunk):
                        number += 1
                        whole.update(data)
                        size += len(data)
                        # Bounded read-ahead: at most `limit` parts in flight plus this one.
                        while len(pending) >= limit:
                            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                            done.extend(f.result() for f in finished)
                        pending.add(pool.submit(send, number, data))
                finished, pending = wait(pending)
                done.extend(f.result() for f in finished)
            finally:
                for future in pending:
                    future.cancel()
        done.sort(key=lambda item: item[0]["PartNumber"])
        part_digests = [digest for _, digest in done]
        digests = _Digests(
            size=size,
            sha256_hex=whole.hexdigest(),
            full_b64=b64_digest(whole.digest()),
            composite_b64=_composite(part_digests),
            part_b64=tuple(b64_digest(d) for d in part_digests),
        )
        return [part for part, _ in done], digests

    def _abort(self, key: str, upload_id: str) -> None:
        try:
            self._client.abort_multipart_upload(Bucket=self._bucket, Key=key, UploadId=upload_id)
        except BotoErrors as exc:
            # Left-over parts cost storage only; a bucket lifecycle rule cleans them up.
            log.warning("could not abort multipart upload %s of %s: %s", upload_id, key, exc)

    def _exists(self, key: str) -> bool:
        try:
            self._client.head_object(Bucket=self._bucket, Key=key)
        except botocore.exceptions.ClientError as exc:
            if is_not_found(exc):
                return False
            raise
        return True

    # -- verification of an existing key -----------------------------------------------------

    def _verify_existing(self, path: Path, key: str, digests: _Digests) -> bool:
        """Accept an existing object only if it holds our bytes; else ObjectConflictError."""
        uri = f"s3://{self._bucket}/{key}"
        head = self._client.head_object(Bucket=self._bucket, Key=key, ChecksumMode="ENABLED")
        stored_size = head.get("ContentLength", -1)
        if stored_size != digests.size:
            raise ObjectConflictError(
                f"{uri} already exists with different content ({stored_size} bytes stored, "
                f"{digests.size} in {path}); nothing was overwritten"
            )
        stored = head.get("ChecksumSHA256")
        if stored and stored in (digests.full_b64, digests.composite_b64):
            return True
        # No checksum, a composite over other part sizes, or a store that reports checksums
        # its own way: only the stored bytes themselves can decide.
        body = self._client.get_object(Bucket=self._bucket, Key=key)["Body"]
        remote = hashlib.sha256()
        try:
            for block in body.iter_chunks(_HASH_BLOCK):
                remote.update(block)
        finally:
            body.close()
        if remote.hexdigest() != digests.sha256_hex:
            raise ObjectConflictError(
                f"{uri} already exists with different content (stored sha256 "
                f"{remote.hexdigest()}, local {digests.sha256_hex}); nothing was overwritten"
            )
        return True
