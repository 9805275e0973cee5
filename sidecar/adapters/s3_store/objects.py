"""What the record store and the lease share: the SHA-256 checksum S3 verifies on a put, and how
a failed call is classified."""

from __future__ import annotations

import hashlib

import botocore.exceptions

from sidecar.adapters.s3_client import b64_digest, describe, is_auth_failure
from sidecar.core.errors import ConfigError, SoakError, StoreUnavailableError
from sidecar.settings import S3Settings


def checksum(data: bytes) -> str:
    """The base64 SHA-256 of ``data``, as PutObject's ChecksumSHA256 takes it."""
    return b64_digest(hashlib.sha256(data).digest())


def store_error(exc: BaseException, what: str, settings: S3Settings) -> SoakError:
    """Credentials and a missing bucket are configuration; anything else may pass on retry."""
    text = f"{what}: {describe(exc, settings)}"
    if is_auth_failure(exc) or (
        isinstance(exc, botocore.exceptions.ClientError)
        and exc.response.get("Error", {}).get("Code") == "NoSuchBucket"
    ):
        return ConfigError(text)
    return StoreUnavailableError(text)
