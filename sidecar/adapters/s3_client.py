"""The boto3 client shared by the S3 artifact sink and the S3 deadline store.

Credentials come from files when ``s3.credentials_dir`` is set (the chart mounts its Secret there, in
the sidecar container only, so they are in no environment a trainer could read), re-read as they
rotate; otherwise from boto3's own chain (env, web identity, shared files, container/instance
metadata).
Retries are botocore's "standard" mode; every attempt is counted so callers and tests can see
how many retries an outcome took.
"""

from __future__ import annotations

import base64
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import boto3
import botocore.exceptions
from botocore.config import Config
from botocore.credentials import CredentialProvider, RefreshableCredentials

from sidecar.core.errors import ConfigError
from sidecar.settings import S3Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

AUTH_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "InvalidClientTokenId",
        "AuthorizationHeaderMalformed",
    }
)
CHECKSUM_CODES = frozenset({"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch", "InvalidChecksum"})
# 409 ConditionalRequestConflict: a concurrent conditional write on the key; S3 asks for a retry.
CONFLICT_RETRIES = 3
# Raised by botocore when the endpoint cannot be reached even after its retries.
UNREACHABLE_ERRORS: tuple[type[Exception], ...] = (
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectTimeoutError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectionClosedError,
    botocore.exceptions.ConnectionError,
)


@dataclass
class S3Stats:
    """API calls made and HTTP attempts sent (attempts - calls = retries), thread-safe."""

    calls: int = 0
    attempts: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def retries(self) -> int:
        return self.attempts - self.calls

    def _on_call(self, **_: Any) -> None:
        with self._lock:
            self.calls += 1

    def _on_send(self, **_: Any) -> None:
        # before-send handlers must return None, or botocore takes the value as the response.
        with self._lock:
            self.attempts += 1

    def attach(self, client: S3Client) -> None:
        client.meta.events.register("before-call.s3", self._on_call)
        client.meta.events.register("before-send.s3", self._on_send)

    def detach(self, client: S3Client) -> None:
        client.meta.events.unregister("before-call.s3", self._on_call)
        client.meta.events.unregister("before-send.s3", self._on_send)


ClientFactory = Callable[[S3Settings], "S3Client"]


def botocore_config(settings: S3Settings) -> Config:
    extra: dict[str, Any] = {}
    if settings.checksum_when_required:
        extra["request_checksum_calculation"] = "when_required"
        extra["response_checksum_validation"] = "when_required"
    return Config(
        region_name=settings.region,
        # total_max_attempts counts the first try (as AWS_MAX_ATTEMPTS does); botocore's
        # "max_attempts" key would count retries only and send one request more.
        retries={"mode": "standard", "total_max_attempts": settings.max_attempts},
        connect_timeout=settings.connect_timeout_s,
        read_timeout=settings.read_timeout_s,
        s3={"addressing_style": settings.addressing_style},
        # Room for every concurrent part plus the main thread.
        max_pool_connections=max(10, settings.multipart_concurrency + 2),
        **extra,
    )


def _skip_redundant_payload_hash(request: Any, **_: Any) -> None:
    """Requests carrying our signed ``x-amz-checksum-sha256`` need no SigV4 payload hash.

    The server verifies that checksum against the body and the header is itself signed, so
    hashing the body again for the signature (what botocore does over plain http) costs a full
    SHA-256 pass and protects nothing more. Over https botocore already skips it for uploads.
    """
    if "x-amz-checksum-sha256" not in request.headers:
        return
    config = request.context.get("client_config")
    if config is not None:
        s3: Any = {**(config.s3 or {}), "payload_signing_enabled": False}
        request.context["client_config"] = config.merge(Config(s3=s3))


def prepare_client(client: S3Client, stats: S3Stats) -> None:
    """Hooks every client of ours gets, whoever built it: attempt counting, no double hashing."""
    stats.attach(client)
    client.meta.events.register("before-sign.s3.PutObject", _skip_redundant_payload_hash)
    client.meta.events.register("before-sign.s3.UploadPart", _skip_redundant_payload_hash)


BotoErrors = (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)


def build_client(
    settings: S3Settings, client_factory: Callable[[S3Settings], S3Client]
) -> tuple[S3Client, S3Stats]:
    """A prepared client and its stats; a client that cannot be built is a ConfigError."""
    try:
        client = client_factory(settings)
    except (*BotoErrors, ValueError) as exc:
        raise ConfigError(f"cannot build the S3 client: {exc}") from exc
    stats = S3Stats()
    prepare_client(client, stats)
    return client, stats


def make_s3_client(settings: S3Settings, *, session: boto3.session.Session | None = None) -> S3Client:
    """An S3 client for ``settings``; ``session`` overrides the credentials (files or boto3's chain)."""
    if session is None:
        session = boto3.session.Session()
        if settings.credentials_dir is not None:
            provider = FileCredentialProvider(settings.credentials_dir)
            provider.load()  # unreadable files are a usage error now, not an upload failure later
            session._session.get_component("credential_provider").insert_before("env", provider)
    return session.client("s3", endpoint_url=settings.endpoint_url, config=botocore_config(settings))


ACCESS_KEY_FILE = "access-key-id"
SECRET_KEY_FILE = "secret-access-key"  # noqa: S105 - a file name, not a secret
SESSION_TOKEN_FILE = "session-token"  # noqa: S105 - a file name, not a secret
CREDENTIAL_FILE_LIMIT = 4096
# How long a reading counts: botocore refreshes in the last 15 minutes, so the files are re-read
# about every five minutes (a rotated Secret reaches the mounted files within a minute or two).
CREDENTIAL_REFRESH_S = 20 * 60


class FileCredentialProvider(CredentialProvider):
    """Credentials from ``access-key-id``, ``secret-access-key`` and (optional) ``session-token``
    files in one directory, such as a mounted Kubernetes Secret; refreshed as the files change."""

    METHOD = "soak-sidecar-credential-files"
    CANONICAL_NAME = "SoakSidecarCredentialFiles"

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self._directory = directory

    def load(self) -> RefreshableCredentials:
        return RefreshableCredentials.create_from_metadata(
            metadata=self._read(), refresh_using=self._read, method=self.METHOD
        )

    def _read(self) -> dict[str, Any]:
        token = self._file(SESSION_TOKEN_FILE, optional=True)
        expiry = datetime.now(timezone.utc) + timedelta(seconds=CREDENTIAL_REFRESH_S)
        return {
            "access_key": self._file(ACCESS_KEY_FILE),
            "secret_key": self._file(SECRET_KEY_FILE),
            "token": token,
            "expiry_time": expiry.isoformat(),
        }

    def _file(self, name: str, *, optional: bool = False) -> str | None:
        path = self._directory / name
        try:
            with path.open("rb") as handle:
                data = handle.read(CREDENTIAL_FILE_LIMIT + 1)
        except FileNotFoundError:
            if optional:
                return None
            raise ConfigError(f"S3 credentials: {path} is missing") from None
        except OSError as exc:
            raise ConfigError(f"S3 credentials: cannot read {path}: {exc.strerror}") from exc
        text = data.decode("utf-8", errors="replace").strip()
        if not text or len(data) > CREDENTIAL_FILE_LIMIT:
            raise ConfigError(f"S3 credentials: {path} is empty or larger than {CREDENTIAL_FILE_LIMIT} bytes")
        return text


def write_args(settings: S3Settings, sha256_hex: str | None) -> dict[str, Any]:
    """What every object written carries: encryption and storage class as configured, and its sha256
    as metadata (for people; the server-verified checksum is what is trusted)."""
    args: dict[str, Any] = {"Metadata": {"sha256": sha256_hex}} if sha256_hex else {}
    if settings.sse:
        args["ServerSideEncryption"] = settings.sse
    if settings.sse_kms_key_id:
        args["SSEKMSKeyId"] = settings.sse_kms_key_id
    if settings.storage_class:
        args["StorageClass"] = settings.storage_class
    return args


def b64_digest(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


def error_code(exc: BaseException) -> str:
    """The S3 error code of a ClientError ('' for other errors)."""
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def http_status(exc: BaseException) -> int:
    if isinstance(exc, botocore.exceptions.ClientError):
        return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
    return 0


def is_precondition_failed(exc: BaseException) -> bool:
    return http_status(exc) == 412 or error_code(exc) == "PreconditionFailed"


def is_conditional_conflict(exc: BaseException) -> bool:
    """409 on a conditional write: a concurrent request raced us; S3 says retry."""
    return http_status(exc) == 409 or error_code(exc) == "ConditionalRequestConflict"


def is_not_found(exc: BaseException) -> bool:
    return http_status(exc) == 404 or error_code(exc) in ("NoSuchKey", "404", "NotFound")


def is_auth_failure(exc: BaseException) -> bool:
    if isinstance(exc, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError):
        return True
    return error_code(exc) in AUTH_CODES or http_status(exc) == 403


def describe(exc: BaseException, settings: S3Settings, attempts: int | None = None) -> str:
    """One line saying what went wrong and what to check, without botocore internals."""
    where = f"endpoint {settings.endpoint_url or 'AWS'}, bucket {settings.bucket}"
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return (
            "no S3 credentials found (env AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, web identity, "
            f"shared files) ({where})"
        )
    if isinstance(exc, UNREACHABLE_ERRORS):
        tried = f" after {attempts} HTTP attempts" if attempts else ""
        return f"S3 endpoint unreachable{tried} ({where}): {exc}"
    return _describe_answer(exc, where)


def _describe_answer(exc: BaseException, where: str) -> str:
    """What S3 answered (or botocore made of it): permissions, checksum, bucket, anything else."""
    code = error_code(exc)
    if is_auth_failure(exc):
        message = (
            exc.response["Error"].get("Message", "")
            if isinstance(exc, botocore.exceptions.ClientError)
            else str(exc)
        )
        return f"S3 rejected the credentials or permissions: {code or 'HTTP 403'}: {message} ({where})"
    if code in CHECKSUM_CODES:
        return (
            f"S3 rejected the upload's SHA-256 checksum ({code}): the bytes received differ from "
            f"the local file (corrupted in transit or changed while uploading) ({where})"
        )
    if code == "NoSuchBucket":
        return f"S3 bucket does not exist ({where})"
    if isinstance(exc, botocore.exceptions.ClientError):
        message = exc.response.get("Error", {}).get("Message", "")
        return f"S3 error {code or http_status(exc)}: {message} ({where})"
    return f"S3 client error: {exc} ({where})"


_T = TypeVar("_T")


def retry_conflicts(call: Callable[[], _T]) -> _T:
    """Run a conditional write, retrying when S3 answers 409 (a concurrent conditional write)."""
    attempt = 0
    while True:
        try:
            return call()
        except botocore.exceptions.ClientError as exc:
            attempt += 1
            if not is_conditional_conflict(exc) or attempt >= CONFLICT_RETRIES:
                raise
            # Full jitter: writers that collided once do not collide again in step.
            time.sleep(random.uniform(0, 0.2 * 2**attempt))  # noqa: S311 - spreading retries, not a secret
