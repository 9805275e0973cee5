"""The S3 artifact sink against a real SeaweedFS (signatures, checksums, conditional writes)."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pytest

from sidecar.adapters.s3_client import make_s3_client
from sidecar.adapters.s3_sink import S3ArtifactSink
from sidecar.core.errors import ConfigError, ObjectConflictError, UploadError
from sidecar.settings import S3Settings
from tests.cluster.system import free_ports
from tests.fixtures.s3 import REGION, SeaweedServer

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

pytestmark = [pytest.mark.integration, pytest.mark.s3]

MIB = 1024 * 1024


def _b64sha(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _small_parts(server: SeaweedServer, **extra: Any) -> S3Settings:
    return server.settings(multipart_threshold_bytes=5 * MIB, multipart_chunk_bytes=5 * MIB, **extra)


def _with_hook(
    server: SeaweedServer, event: str, handler: Callable[..., Any]
) -> Callable[[S3Settings], S3Client]:
    """A client factory whose clients run ``handler`` on a botocore event."""

    def build(settings: S3Settings) -> S3Client:
        client = server.factory()(settings)
        client.meta.events.register(event, handler)
        return client

    return build


def test_single_part_upload_carries_and_stores_the_sha256(
    seaweedfs: SeaweedServer, s3_prefix: str, tmp_path: Path
) -> None:
    data = b'{"verdict": "passed"}\n' * 100
    files = [_write(tmp_path / "artifact.json", data), _write(tmp_path / "console.log", b"line\n")]
    sink = S3ArtifactSink(seaweedfs.settings(), client_factory=seaweedfs.factory())

    uploaded = sink.upload(files, s3_prefix)

    assert [u.uri for u in uploaded] == [
        f"s3://{seaweedfs.bucket}/{s3_prefix}artifact.json",
        f"s3://{seaweedfs.bucket}/{s3_prefix}console.log",
    ]
    first = uploaded[0]
    assert (first.sha256, first.size, first.parts, first.already_present) == (
        hashlib.sha256(data).hexdigest(),
        len(data),
        1,
        False,
    )
    client = seaweedfs.client()
    head = client.head_object(
        Bucket=seaweedfs.bucket, Key=f"{s3_prefix}artifact.json", ChecksumMode="ENABLED"
    )
    assert head["ChecksumSHA256"] == _b64sha(data)
    assert head["Metadata"]["sha256"] == first.sha256
    body = client.get_object(Bucket=seaweedfs.bucket, Key=f"{s3_prefix}artifact.json")["Body"]
    assert body.read() == data


def test_multipart_upload_sends_a_checksum_per_part(
    seaweedfs: SeaweedServer, s3_prefix: str, tmp_path: Path
) -> None:
    data = os.urandom(12 * MIB + 12345)
    path = _write(tmp_path / "samples.jsonl.gz", data)
    part_checksums: list[str] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        part_checksums.append(params["ChecksumSHA256"])

    sink = S3ArtifactSink(
        _small_parts(seaweedfs),
        client_factory=_with_hook(seaweedfs, "provide-client-params.s3.UploadPart", record),
    )
    (uploaded,) = sink.upload([path], s3_prefix)

    assert uploaded.parts == 3
    expected_parts = [_b64sha(data[i : i + 5 * MIB]) for i in range(0, len(data), 5 * MIB)]
    assert sorted(part_checksums) == sorted(expected_parts)
    composite = hashlib.sha256(b"".join(base64.b64decode(c) for c in expected_parts)).digest()
    head = seaweedfs.client().head_object(
        Bucket=seaweedfs.bucket, Key=f"{s3_prefix}samples.jsonl.gz", ChecksumMode="ENABLED"
    )
    assert head["ChecksumSHA256"] == f"{base64.b64encode(composite).decode()}-3"
    assert head["ContentLength"] == len(data)
    body = seaweedfs.client().get_object(Bucket=seaweedfs.bucket, Key=f"{s3_prefix}samples.jsonl.gz")
    assert hashlib.sha256(body["Body"].read()).hexdigest() == uploaded.sha256


def _corrupt_checksum(params: dict[str, Any], **_: Any) -> None:
    params["ChecksumSHA256"] = _b64sha(b"not the bytes that are sent")


def test_server_rejects_a_wrong_checksum_and_the_error_says_so(
    seaweedfs: SeaweedServer, s3_prefix: str, tmp_path: Path
) -> None:
    path = _write(tmp_path / "artifact.json", b"{}")
    sink = S3ArtifactSink(
        seaweedfs.settings(),
        client_factory=_with_hook(seaweedfs, "provide-client-params.s3.PutObject", _corrupt_checksum),
    )
    with pytest.raises(UploadError, match="rejected the upload's SHA-256 checksum") as info:
        sink.upload([path], s3_prefix)
    assert "BadDigest" in str(info.value)
    listing = seaweedfs.client().list_objects_v2(Bucket=seaweedfs.bucket, Prefix=s3_prefix)
    assert listing.get("KeyCount") == 0


def test_a_corrupted_part_fails_the_upload_and_aborts_it(
    seaweedfs: SeaweedServer, s3_prefix: str, tmp_path: Path
) -> None:
    path = _write(tmp_path / "big.bin", os.urandom(11 * MIB))
    sink = S3ArtifactSink(
        _small_parts(seaweedfs),
        client_factory=_with_hook(seaweedfs, "provide-client-params.s3.UploadPart", _corrupt_checksum),
    )
    with pytest.raises(UploadError, match="SHA-256 checksum"):
        sink.upload([path], s3_prefix)
    client = seaweedfs.client()
    uploads = client.list_multipart_uploads(Bucket=seaweedfs.bucket, Prefix=s3_prefix)
    assert uploads.get("Uploads", []) == []
    assert client.list_objects_v2(Bucket=seaweedfs.bucket, Prefix=s3_prefix).get("KeyCount") == 0


def test_a_file_changed_after_hashing_is_rejected(
    seaweedfs: SeaweedServer, s3_prefix: str, tmp_path: Path
) -> None:
    path = _write(tmp_path / "console.log", b"A" * 1000)

    def rewrite(**_: Any) -> None:
        path.write_bytes(b"B" * 1000)  # same size, different bytes, after our hash

    sink = S3ArtifactSink(
        seaweedfs.settings(), client_factory=_with_hook(seaweedfs, "before-call.s3.PutObject", rewrite)
    )
    with pytest.raises(UploadError, match="changed while uploading"):
        sink.upload([path], s3_prefix)


@pytest.mark.parametrize("size", [100, 11 * MIB], ids=["single", "multipart"])
def test_never_overwrites_and_accepts_only_its_own_bytes(
    seaweedfs: SeaweedServer, s3_prefix: str, tmp_path: Path, size: int
) -> None:
    original = os.urandom(size)
    sink = S3ArtifactSink(_small_parts(seaweedfs), client_factory=seaweedfs.factory())
    (first,) = sink.upload([_write(tmp_path / "artifact.json", original)], s3_prefix)
    assert not first.already_present

    (again,) = sink.upload([tmp_path / "artifact.json"], s3_prefix)
    assert again.already_present and again.sha256 == first.sha256

    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ObjectConflictError, match="already exists with different content"):
        sink.upload([_write(other / "artifact.json", os.urandom(size))], s3_prefix)
    stored = seaweedfs.client().get_object(Bucket=seaweedfs.bucket, Key=f"{s3_prefix}artifact.json")
    assert stored["Body"].read() == original


def test_multipart_completion_is_conditional_when_the_key_appears_meanwhile(
    seaweedfs: SeaweedServer, s3_prefix: str, tmp_path: Path
) -> None:
    """Someone writes the key after our existence check: CompleteMultipartUpload gets 412."""
    key = f"{s3_prefix}big.bin"
    intruder = seaweedfs.client()

    def race(**_: Any) -> None:
        intruder.put_object(Bucket=seaweedfs.bucket, Key=key, Body=b"x" * (11 * MIB))

    sink = S3ArtifactSink(
        _small_parts(seaweedfs),
        client_factory=_with_hook(seaweedfs, "before-call.s3.CompleteMultipartUpload", race),
    )
    with pytest.raises(ObjectConflictError, match="different content"):
        sink.upload([_write(tmp_path / "big.bin", os.urandom(11 * MIB))], s3_prefix)
    stored = seaweedfs.client().get_object(Bucket=seaweedfs.bucket, Key=key)["Body"].read()
    assert stored == b"x" * (11 * MIB)
    assert intruder.list_multipart_uploads(Bucket=seaweedfs.bucket, Prefix=s3_prefix).get("Uploads", []) == []


def test_existing_object_without_checksum_is_verified_by_its_bytes(
    seaweedfs: SeaweedServer, s3_prefix: str, tmp_path: Path
) -> None:
    data = os.urandom(4096)
    plain = seaweedfs.factory()(seaweedfs.settings(checksum_when_required=True))
    plain.put_object(Bucket=seaweedfs.bucket, Key=f"{s3_prefix}artifact.json", Body=data)
    head = plain.head_object(Bucket=seaweedfs.bucket, Key=f"{s3_prefix}artifact.json", ChecksumMode="ENABLED")
    assert "ChecksumSHA256" not in head

    sink = S3ArtifactSink(seaweedfs.settings(), client_factory=seaweedfs.factory())
    (uploaded,) = sink.upload([_write(tmp_path / "artifact.json", data)], s3_prefix)
    assert uploaded.already_present


def test_existing_object_without_checksum_and_other_bytes_is_a_conflict(
    seaweedfs: SeaweedServer, s3_prefix: str, tmp_path: Path
) -> None:
    plain = seaweedfs.factory()(seaweedfs.settings(checksum_when_required=True))
    plain.put_object(Bucket=seaweedfs.bucket, Key=f"{s3_prefix}artifact.json", Body=b"A" * 4096)
    sink = S3ArtifactSink(seaweedfs.settings(), client_factory=seaweedfs.factory())
    with pytest.raises(ObjectConflictError, match="different content"):
        sink.upload([_write(tmp_path / "artifact.json", b"B" * 4096)], s3_prefix)


def test_wrong_secret_gives_a_clear_credentials_error(
    seaweedfs: SeaweedServer, s3_prefix: str, tmp_path: Path
) -> None:
    sink = S3ArtifactSink(seaweedfs.settings(), client_factory=seaweedfs.factory(secret_key="not-the-secret"))
    with pytest.raises(UploadError, match="rejected the credentials") as info:
        sink.upload([_write(tmp_path / "a.json", b"{}")], s3_prefix)
    assert "SignatureDoesNotMatch" in str(info.value)
    assert isinstance(info.value.__cause__, Exception)
    assert sink.stats.retries == 0  # a 403 is not retried


def test_unknown_access_key_gives_a_clear_credentials_error(
    seaweedfs: SeaweedServer, s3_prefix: str, tmp_path: Path
) -> None:
    sink = S3ArtifactSink(seaweedfs.settings(), client_factory=seaweedfs.factory(access_key="nobody"))
    with pytest.raises(UploadError, match="InvalidAccessKeyId"):
        sink.upload([_write(tmp_path / "a.json", b"{}")], s3_prefix)


def test_endpoint_down_is_retried_then_reported_as_lost_evidence(
    seaweedfs: SeaweedServer, tmp_path: Path
) -> None:
    (closed_port,) = free_ports(1)
    settings = seaweedfs.settings(
        endpoint_url=f"http://127.0.0.1:{closed_port}", max_attempts=3, connect_timeout_s=1.0
    )
    sink = S3ArtifactSink(settings, client_factory=seaweedfs.factory())
    with pytest.raises(UploadError, match="unreachable after 3 HTTP attempts") as info:
        sink.upload([_write(tmp_path / "a.json", b"{}")], "p/")
    assert info.value.exit_code.name == "EVIDENCE_LOST"
    assert (sink.stats.calls, sink.stats.attempts, sink.stats.retries) == (1, 3, 2)


def test_credentials_from_the_environment_chain(
    seaweedfs: SeaweedServer, s3_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Kubernetes Secret arrives as env vars; boto3's default chain must pick them up."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweedfs.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweedfs.secret_key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    sink = S3ArtifactSink(seaweedfs.settings())  # default factory: boto3's credential chain
    (uploaded,) = sink.upload([_write(tmp_path / "a.json", b"{}")], s3_prefix)
    assert uploaded.uri.endswith("/a.json")


def test_no_credentials_at_all_is_a_clear_error(
    seaweedfs: SeaweedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    sink = S3ArtifactSink(
        seaweedfs.settings(),
        client_factory=lambda s: make_s3_client(s, session=boto3.session.Session(region_name=REGION)),
    )
    with pytest.raises(UploadError, match="no S3 credentials found"):
        sink.upload([_write(tmp_path / "a.json", b"{}")], "p/")


def test_checksum_when_required_still_sends_our_sha256(
    seaweedfs: SeaweedServer, s3_prefix: str, tmp_path: Path
) -> None:
    data = os.urandom(6 * MIB)
    sink = S3ArtifactSink(
        _small_parts(seaweedfs, checksum_when_required=True), client_factory=seaweedfs.factory()
    )
    (uploaded,) = sink.upload([_write(tmp_path / "big.bin", data)], s3_prefix)
    head = seaweedfs.client().head_object(
        Bucket=seaweedfs.bucket, Key=f"{s3_prefix}big.bin", ChecksumMode="ENABLED"
    )
    assert uploaded.parts == 2
    assert head["ChecksumSHA256"].endswith("-2")


def test_server_side_encryption_and_storage_class_are_applied(
    seaweedfs: SeaweedServer, s3_prefix: str, tmp_path: Path
) -> None:
    sink = S3ArtifactSink(
        seaweedfs.settings(sse="AES256", storage_class="STANDARD_IA"),
        client_factory=seaweedfs.factory(),
    )
    sink.upload([_write(tmp_path / "a.json", b"{}")], s3_prefix)
    head = seaweedfs.client().head_object(Bucket=seaweedfs.bucket, Key=f"{s3_prefix}a.json")
    assert head.get("ServerSideEncryption") == "AES256"
    assert head.get("StorageClass") == "STANDARD_IA"


def credentials(directory: Path, access_key: str, secret_key: str) -> Path:
    """A mounted Secret's shape: one file per key (with a trailing newline, as editors leave it)."""
    directory.mkdir()
    (directory / "access-key-id").write_text(access_key + "\n")
    (directory / "secret-access-key").write_text(secret_key + "\n")
    return directory


def test_credentials_come_from_files_not_the_environment(
    tmp_path: Path, seaweedfs: SeaweedServer, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    directory = credentials(tmp_path / "s3-credentials", seaweedfs.access_key, seaweedfs.secret_key)
    evidence = tmp_path / "artifact.json"
    evidence.write_text("{}")
    sink = S3ArtifactSink(seaweedfs.settings(credentials_dir=directory))
    (uploaded,) = sink.upload([evidence], s3_prefix)
    assert uploaded.uri.endswith("/artifact.json")

    wrong = credentials(tmp_path / "wrong", seaweedfs.access_key, "not-the-secret")
    with pytest.raises(UploadError, match=r"(?i)signature|denied|forbidden"):
        S3ArtifactSink(seaweedfs.settings(credentials_dir=wrong)).upload([evidence], s3_prefix + "w/")


def test_missing_credential_files_are_a_usage_error_at_once(tmp_path: Path, seaweedfs: SeaweedServer) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="access-key-id is missing"):
        S3ArtifactSink(seaweedfs.settings(credentials_dir=tmp_path / "empty"))
