"""Fast checks of the S3 sink and store logic on moto (the SeaweedFS tests show the same
behaviours against a server that also enforces signatures and checksums)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import botocore.exceptions
import pytest
from moto import mock_aws

from sidecar.adapters.s3_client import describe, make_s3_client
from sidecar.adapters.s3_sink import S3ArtifactSink
from sidecar.adapters.s3_store import S3DeadlineStore
from sidecar.core.errors import (
    AlreadySupervisedError,
    ConfigError,
    ObjectConflictError,
    RecordExistsError,
    UploadError,
)
from sidecar.settings import S3Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

BUCKET = "soak-unit"
MIB = 1024 * 1024


def _factory(settings: S3Settings) -> S3Client:
    session = boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    )
    return make_s3_client(settings, session=session)


@pytest.fixture
def settings() -> Iterator[S3Settings]:
    with mock_aws():
        base = S3Settings.model_validate(
            {
                "bucket": BUCKET,
                "region": "us-east-1",
                "multipart_threshold_bytes": 5 * MIB,
                "multipart_chunk_bytes": 5 * MIB,
                "lock_lease_s": 0.2,
                "lock_renew_interval_s": 0.05,
            }
        )
        _factory(base).create_bucket(Bucket=BUCKET)
        yield base


def test_sink_needs_a_bucket() -> None:
    with pytest.raises(ConfigError, match=r"needs s3\.bucket"):
        S3ArtifactSink(S3Settings.model_validate({}))


def test_two_files_with_one_name_are_refused(settings: S3Settings, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for sub in ("a", "b"):
        (tmp_path / sub / "console.log").write_bytes(b"x")
    sink = S3ArtifactSink(settings, client_factory=_factory)
    with pytest.raises(UploadError, match=r"share a name: console\.log"):
        sink.upload([tmp_path / "a" / "console.log", tmp_path / "b" / "console.log"], "p/")


def test_upload_single_and_multipart_then_verify_on_repeat(settings: S3Settings, tmp_path: Path) -> None:
    small = tmp_path / "artifact.json"
    small.write_bytes(b"{}")
    big = tmp_path / "samples.jsonl.gz"
    big.write_bytes(os.urandom(11 * MIB))
    sink = S3ArtifactSink(settings, client_factory=_factory)
    first = sink.upload([small, big], "soak/run/")
    assert [(o.parts, o.already_present) for o in first] == [(1, False), (3, False)]
    again = sink.upload([small, big], "soak/run/")
    assert [(o.parts, o.already_present) for o in again] == [(1, True), (3, True)]
    assert [o.sha256 for o in again] == [o.sha256 for o in first]
    keys = [o["Key"] for o in _factory(settings).list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert sorted(keys) == ["soak/run/artifact.json", "soak/run/samples.jsonl.gz"]


def test_different_bytes_under_the_same_key_are_a_conflict(settings: S3Settings, tmp_path: Path) -> None:
    path = tmp_path / "artifact.json"
    path.write_bytes(b'{"a": 1}')
    sink = S3ArtifactSink(settings, client_factory=_factory)
    sink.upload([path], "p/")
    path.write_bytes(b'{"a": 2}')
    with pytest.raises(ObjectConflictError, match="nothing was overwritten"):
        sink.upload([path], "p/")


def test_a_segment_from_memory_is_never_rewritten(settings: S3Settings) -> None:
    """A segment or provisional record: a retry with the same bytes is accepted, other bytes are not."""
    sink = S3ArtifactSink(settings, client_factory=_factory)
    first = sink.upload_bytes("samples.jsonl.gz.seg-000001", b"\x1f\x8bsegment", "p/")
    assert first.uri == f"s3://{BUCKET}/p/samples.jsonl.gz.seg-000001" and not first.already_present
    again = sink.upload_bytes("samples.jsonl.gz.seg-000001", b"\x1f\x8bsegment", "p/")
    assert again.already_present and again.sha256 == first.sha256
    with pytest.raises(ObjectConflictError, match="nothing was overwritten"):
        sink.upload_bytes("samples.jsonl.gz.seg-000001", b"other", "p/")
    stored = _factory(settings).get_object(Bucket=BUCKET, Key="p/samples.jsonl.gz.seg-000001")
    assert stored["Body"].read() == b"\x1f\x8bsegment"
    with pytest.raises(UploadError, match="invalid artifact key"):
        sink.upload_bytes("a/b", b"x", "p/")


def test_upload_refuses_an_unsafe_prefix(settings: S3Settings, tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(b"{}")
    with pytest.raises(UploadError, match=r"invalid artifact key: .*'\.\.'"):
        S3ArtifactSink(settings, client_factory=_factory).upload([path], "p/../q/")


def test_store_create_load_conflict(settings: S3Settings) -> None:
    store = S3DeadlineStore(settings, client_factory=_factory)
    run_id = str(uuid.uuid4())
    assert store.load(run_id) is None
    store.create(run_id, b"one")
    with pytest.raises(RecordExistsError):
        store.create(run_id, b"two")
    assert store.load(run_id) == b"one"


class _JumpingClock:
    """Monotonic time that advances a lease length per reading: a waiter sees time pass."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def wall(self) -> float:
        return 1_700_000_000.0 + self.now

    def monotonic(self) -> float:
        self.now += self.step
        return self.now


def test_a_stale_lease_is_taken_over_conditionally(settings: S3Settings) -> None:
    run_id = str(uuid.uuid4())
    client = _factory(settings)
    store = S3DeadlineStore(settings, client_factory=_factory, clock=_JumpingClock(1.0))
    client.put_object(Bucket=BUCKET, Key=store.lock_key(run_id), Body=b'{"owner": "dead"}')
    with store.lock(run_id):
        body = client.get_object(Bucket=BUCKET, Key=store.lock_key(run_id))["Body"].read()
        assert b'"owner": "dead"' not in body
    assert "Contents" not in client.list_objects_v2(Bucket=BUCKET, Prefix=store.lock_key(run_id))


def test_a_lease_that_changes_while_watched_is_a_live_owner(settings: S3Settings) -> None:
    run_id = str(uuid.uuid4())
    client = _factory(settings)
    key = f"{settings.deadline_prefix}/{run_id}.lock"
    client.put_object(Bucket=BUCKET, Key=key, Body=b'{"seq": 0}')

    def renew(**_: Any) -> None:
        client.put_object(Bucket=BUCKET, Key=key, Body=os.urandom(8))  # the owner renews

    def factory(s: S3Settings) -> S3Client:
        watched = _factory(s)
        watched.meta.events.register("after-call.s3.GetObject", renew)
        return watched

    # A clock that never moves: only the observed change can decide.
    store = S3DeadlineStore(settings, client_factory=factory, clock=_JumpingClock(0.0))
    with pytest.raises(AlreadySupervisedError, match="renews its lease"), store.lock(run_id):
        pass


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            botocore.exceptions.ClientError(
                {"Error": {"Code": "AccessDenied", "Message": "no"}}, "PutObject"
            ),
            "rejected the credentials or permissions: AccessDenied",
        ),
        (
            botocore.exceptions.ClientError(
                {"Error": {"Code": "NoSuchBucket", "Message": "gone"}}, "PutObject"
            ),
            "bucket does not exist",
        ),
        (
            botocore.exceptions.ClientError(
                {"Error": {"Code": "XAmzContentSHA256Mismatch", "Message": "x"}}, "PutObject"
            ),
            "SHA-256 checksum",
        ),
        (botocore.exceptions.NoCredentialsError(), "no S3 credentials found"),
        (
            botocore.exceptions.EndpointConnectionError(endpoint_url="http://x"),
            "unreachable after 4 HTTP attempts",
        ),
        (
            botocore.exceptions.ClientError(
                {"Error": {"Code": "InternalError", "Message": "boom"}}, "PutObject"
            ),
            "S3 error InternalError: boom",
        ),
    ],
)
def test_error_descriptions_say_what_to_check(error: Exception, expected: str) -> None:
    settings = S3Settings.model_validate({"bucket": "b", "endpoint_url": "http://e"})
    text = describe(error, settings, attempts=4)
    assert expected in text
    assert "endpoint http://e, bucket b" in text
