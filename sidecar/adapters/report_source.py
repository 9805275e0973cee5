"""Where a report's artifact and samples come from: a local file or directory, or an s3:// URI.

Both are untrusted input: the artifact is read up to ARTIFACT_LIMIT bytes, samples are streamed
line by line (a line that is not a JSON object is skipped and counted), regular files only.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.adapters.s3_client import make_s3_client
from sidecar.core.errors import ConfigError, SoakError
from sidecar.settings import S3Settings

ARTIFACT_FILE = "artifact.json"
ARTIFACT_LIMIT = 64 * 1024 * 1024
LINE_LIMIT = 4 * 1024 * 1024


@dataclass
class Source:
    artifact: dict[str, Any]
    samples_name: str
    skipped_lines: int = 0

    def samples(self) -> Iterator[dict[str, Any]]:
        raise NotImplementedError


def _read_regular(path: Path, limit: int) -> bytes:
    """At most ``limit`` bytes of a regular file; no symlink followed, no FIFO waited on."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        data = file.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"{path} is larger than {limit} bytes")
    return data


def _parse_artifact(raw: bytes, where: str) -> dict[str, Any]:
    try:
        artifact = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where} is not JSON: {exc}") from exc
    if not isinstance(artifact, dict) or "status" not in artifact:
        raise ConfigError(f"{where} is not a soak-sidecar artifact")
    return artifact


def _samples_name(artifact: dict[str, Any]) -> str:
    name = (artifact.get("samples") or {}).get("samples_file")
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise ConfigError("the artifact names no samples file (was the run monitored at all?)")
    return name


def _lines(stream: io.BufferedIOBase, source: Source) -> Iterator[dict[str, Any]]:
    try:
        with gzip.GzipFile(fileobj=stream) as unzipped:
            for line in unzipped:
                if len(line) > LINE_LIMIT:
                    source.skipped_lines += 1
                    continue
                try:
                    sample = json.loads(line)
                except ValueError:
                    source.skipped_lines += 1
                    continue
                if isinstance(sample, dict) and isinstance(sample.get("t_wall"), (int, float)):
                    yield sample
                else:
                    source.skipped_lines += 1
    except (OSError, EOFError, zlib.error):
        source.skipped_lines += 1  # a truncated file: the samples so far still count


@dataclass
class LocalSource(Source):
    directory: Path = Path()

    def samples(self) -> Iterator[dict[str, Any]]:
        path = self.directory / self.samples_name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise ConfigError(f"cannot read the samples beside the artifact: {exc}") from exc
        with os.fdopen(fd, "rb") as stream:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ConfigError(f"{path} is not a regular file")
            yield from _lines(stream, self)


def open_local(path: Path) -> LocalSource:
    file = path / ARTIFACT_FILE if path.is_dir() else path
    try:
        raw = _read_regular(file, ARTIFACT_LIMIT)
    except OSError as exc:
        raise ConfigError(f"cannot read {file}: {exc}") from exc
    artifact = _parse_artifact(raw, str(file))
    return LocalSource(artifact, _samples_name(artifact), directory=file.parent)


@dataclass
class S3Source(Source):
    client: Any = None
    bucket: str = ""
    prefix: str = ""

    def samples(self) -> Iterator[dict[str, Any]]:
        key = f"{self.prefix}{self.samples_name}"
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        except Exception as exc:  # botocore's errors: any failure to fetch is the same to the user
            raise SoakError(f"cannot read s3://{self.bucket}/{key}: {exc}") from exc
        with body:
            yield from _lines(body, self)


def open_s3(uri: str, settings: S3Settings) -> S3Source:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise ConfigError(f"{uri}: expected s3://BUCKET/KEY")
    if not key.endswith(ARTIFACT_FILE):
        key = f"{key.rstrip('/')}/{ARTIFACT_FILE}" if key else ARTIFACT_FILE
    client = make_s3_client(settings)
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        raw = body.read(ARTIFACT_LIMIT + 1)
    except Exception as exc:  # botocore's errors, as above
        raise SoakError(f"cannot read s3://{bucket}/{key}: {exc}") from exc
    if len(raw) > ARTIFACT_LIMIT:
        raise ConfigError(f"s3://{bucket}/{key} is larger than {ARTIFACT_LIMIT} bytes")
    artifact = _parse_artifact(raw, f"s3://{bucket}/{key}")
    prefix = key[: -len(ARTIFACT_FILE)]
    return S3Source(artifact, _samples_name(artifact), client=client, bucket=bucket, prefix=prefix)


def open_source(location: str, settings: S3Settings) -> Source:
    if location.startswith("s3://"):
        return open_s3(location, settings)
    return open_local(Path(location))
