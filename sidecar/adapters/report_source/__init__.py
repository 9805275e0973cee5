"""Where a report's artifact and samples come from (a local file or directory, or an s3:// URI),
and where the page goes.

Both are untrusted input: the artifact is read up to ARTIFACT_LIMIT bytes, samples are streamed
line by line, each read up to LINE_LIMIT bytes (a line the report cannot draw is skipped and
counted), regular files only, parsed by :mod:`sidecar.core.report_input`. Every object read whole is
hashed as it streams and compared with the SHA-256 the artifact recorded of it: what differs is
named in ``Source.mismatched``. The page is written through no link: the path must be absent or a
regular file of one name.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import botocore.exceptions

from sidecar.adapters.fsutil import write_fsync
from sidecar.adapters.s3_client import is_not_found, make_s3_client
from sidecar.core.artifact.objects import (
    ARTIFACT_FILE,
    CONSOLE_STEM,
    SAMPLES_FILE,
    SEGMENT_MARK,
    newest_provisional,
)
from sidecar.core.errors import ConfigError, SoakError
from sidecar.core.report import CONSOLE_TAIL_BYTES, console_tail
from sidecar.core.report_input import ReportArtifact, parse_artifact
from sidecar.core.report_samples import ReportSample, parse_sample
from sidecar.launcher.protocol.files import UnsafeFileError, open_regular, read_regular
from sidecar.settings import S3Settings

LISTING_LIMIT = 100_000
RUN_ATTEMPTS_LIMIT = 10_000
ARTIFACT_LIMIT = 64 * 1024 * 1024
LINE_LIMIT = 4 * 1024 * 1024


@dataclass
class Source:
    artifact: ReportArtifact
    skipped_lines: int = 0
    # The objects read whose bytes differ from the SHA-256 the artifact recorded, one line each.
    mismatched: list[str] = field(default_factory=list)

    def samples(self) -> Iterator[ReportSample]:
        raise NotImplementedError

    def verify(self, name: str, where: str, read_sha256: str, *, store_disagrees: bool = False) -> None:
        """Compare the bytes read of ``name`` (all of them) with what the artifact recorded;
        ``store_disagrees``: they did not match the checksum the store holds for the object either."""
        recorded = self.artifact.sha256_of(name)
        if recorded is not None and recorded != read_sha256:
            self.mismatched.append(
                f"{where} does not match the SHA-256 its artifact recorded (read {read_sha256[:16]}..., "
                f"recorded {recorded[:16]}...): changed or corrupted since it was uploaded"
            )
        elif store_disagrees:
            self.mismatched.append(
                f"{where} does not match the checksum the store holds for it: corrupted on the way back"
            )

    def console_tail(self) -> str | None:
        """The last lines of the trainer's console kept beside the artifact; None when there is none."""
        raise NotImplementedError


def _lines(stream: io.BufferedIOBase, source: Source) -> Iterator[ReportSample]:
    """The samples of a gzip stream, then the rest of the stream read (its bytes are verified whole)."""
    yield from _parsed(stream, source)
    while stream.read(_DRAIN_BYTES):
        pass


_DRAIN_BYTES = 1 << 20


def _parsed(stream: io.BufferedIOBase, source: Source) -> Iterator[ReportSample]:
    try:
        with gzip.GzipFile(fileobj=stream) as unzipped:
            while line := unzipped.readline(LINE_LIMIT + 1):
                if len(line) > LINE_LIMIT:
                    source.skipped_lines += 1
                    while line and not line.endswith(b"\n"):  # the rest of the long line, a bound at a time
                        line = unzipped.readline(LINE_LIMIT)
                    continue
                try:
                    yield parse_sample(line)
                except ConfigError:
                    source.skipped_lines += 1
    except (OSError, EOFError, zlib.error):
        source.skipped_lines += 1  # a truncated file: the samples so far still count


@dataclass
class LocalSource(Source):
    directory: Path = Path()

    def samples(self) -> Iterator[ReportSample]:
        if self.artifact.samples_file is None:
            return
        path = self.directory / self.artifact.samples_file
        try:
            fd, _ = open_regular(path)
        except UnsafeFileError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
        except OSError as exc:
            raise ConfigError(f"cannot read the samples beside the artifact: {exc}") from exc
        name = self.artifact.samples_file
        with os.fdopen(fd, "rb") as file, io.BufferedReader(_Hashed(file)) as stream:
            yield from _lines(stream, self)
            self.verify(name, str(path), stream.raw.hexdigest())

    def console_tail(self) -> str | None:
        if self.artifact.console_file is None:
            return None
        try:
            fd, size = open_regular(self.directory / self.artifact.console_file)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as file:
            start = max(0, size.st_size - CONSOLE_TAIL_BYTES)
            file.seek(start)
            return console_tail(file.read(CONSOLE_TAIL_BYTES), cut=start > 0)


def is_run_dir(path: Path) -> bool:
    """A run's directory (runs/<run-id>/): attempt directories, no artifact of its own."""
    return path.is_dir() and not (path / ARTIFACT_FILE).exists() and bool(run_attempt_dirs(path))


def run_attempt_dirs(path: Path) -> list[Path]:
    """The run's attempt directories holding an artifact, at most RUN_ATTEMPTS_LIMIT, by name;
    no link followed."""
    found: list[Path] = []
    with os.scandir(path) as entries:
        for entry in entries:
            if len(found) >= RUN_ATTEMPTS_LIMIT:
                break
            if entry.is_dir(follow_symlinks=False) and os.path.isfile(
                os.path.join(entry.path, ARTIFACT_FILE)
            ):
                found.append(Path(entry.path))
    return sorted(found)


def open_local(path: Path) -> LocalSource:
    file = path / ARTIFACT_FILE if path.is_dir() else path
    try:
        raw = read_regular(file, ARTIFACT_LIMIT)
    except OSError as exc:
        raise ConfigError(f"cannot read {file}: {exc}") from exc
    artifact = parse_artifact(raw, str(file))
    if artifact.partial:  # its evidence goes as far as its newest file
        newest = [f.lstat().st_mtime for f in (file, file.parent / SAMPLES_FILE) if f.is_file()]
        artifact = replace(artifact, last_evidence_unix=max(newest, default=None))
    return LocalSource(artifact, directory=file.parent)


class _Hashed(io.RawIOBase):
    """A binary file read through, hashed as it goes."""

    def __init__(self, file: io.BufferedIOBase | io.RawIOBase | Any) -> None:
        self._file = file
        self._sha = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._file.read(len(buffer))
        buffer[: len(data)] = data
        self._sha.update(data)
        return len(data)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


class _Concatenated(io.RawIOBase):
    """The objects ``keys`` read one after the other, as one stream (a file's segments); each
    object's SHA-256 goes to ``read_whole(key, hex)`` once it has been read to its end."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        keys: list[str],
        read_whole: Callable[[str, str, bool], None] | None = None,
    ) -> None:
        self._client, self._bucket, self._keys = client, bucket, list(keys)
        self._body: Any = None
        self._key = ""
        self._sha = hashlib.sha256()
        self._read_whole = read_whole

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while True:
            if self._body is None:
                if not self._keys:
                    return 0
                self._key = self._keys.pop(0)
                self._sha = hashlib.sha256()
                self._body = self._client.get_object(Bucket=self._bucket, Key=self._key)["Body"]
            try:
                data = self._body.read(len(buffer))
                store_disagrees = False
            except botocore.exceptions.FlexibleChecksumError:
                # botocore checked the bytes against the store's own checksum at their end: the
                # object's bytes have all been delivered, and they differ from what it holds.
                data, store_disagrees = b"", True
            if data:
                buffer[: len(data)] = data
                self._sha.update(data)
                return len(data)
            self._body.close()
            self._body = None
            if self._read_whole is not None:
                self._read_whole(self._key, self._sha.hexdigest(), store_disagrees)

    def close(self) -> None:
        if self._body is not None:
            self._body.close()
        super().close()


@dataclass
class S3Source(Source):
    client: Any = None
    bucket: str = ""
    prefix: str = ""
    # A partial attempt's evidence, uploaded in segments while it ran: object name -> size, in order.
    segments: dict[str, int] = field(default_factory=dict)

    def samples(self) -> Iterator[ReportSample]:
        if self.artifact.samples_file is None:
            return
        keys = [f"{self.prefix}{self.artifact.samples_file}"]
        if self.artifact.partial:
            keys = [
                f"{self.prefix}{name}"
                for name in self.segments
                if name.startswith(f"{SAMPLES_FILE}{SEGMENT_MARK}")
            ]
        where = f"s3://{self.bucket}/{keys[0] if keys else self.prefix}"

        def read_whole(key: str, read_sha256: str, store_disagrees: bool) -> None:
            name, where = key.removeprefix(self.prefix), f"s3://{self.bucket}/{key}"
            self.verify(name, where, read_sha256, store_disagrees=store_disagrees)

        try:
            with io.BufferedReader(_Concatenated(self.client, self.bucket, keys, read_whole)) as stream:
                yield from _lines(stream, self)
        except SoakError:
            raise
        except (
            Exception
        ) as exc:  # botocore's and urllib3's errors: any failure to fetch is the same to the user
            raise SoakError(f"cannot read {where}: {exc}") from exc

    def console_tail(self) -> str | None:
        if self.artifact.partial:
            return self._segments_tail()
        if self.artifact.console_file is None:
            return None
        key = f"{self.prefix}{self.artifact.console_file}"
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes=-{CONSOLE_TAIL_BYTES}")
            with answer["Body"] as body:
                data = body.read(CONSOLE_TAIL_BYTES)
        except Exception:
            return None
        # "bytes 100-8291/8292": the range started mid-file when its first byte is not 0.
        return console_tail(data, cut=not str(answer.get("ContentRange", "bytes 0-")).startswith("bytes 0-"))

    def _segments_tail(self) -> str | None:
        """The last CONSOLE_TAIL_BYTES of the console's segments (the newest ones only are read)."""
        names = [name for name in self.segments if name.startswith(f"{CONSOLE_STEM}{SEGMENT_MARK}")]
        if not names:
            return None
        chosen: list[str] = []
        size = 0
        while names and size < CONSOLE_TAIL_BYTES:
            chosen.insert(0, names.pop())
            size += self.segments[chosen[0]]
        try:
            with io.BufferedReader(
                _Concatenated(self.client, self.bucket, [self.prefix + n for n in chosen])
            ) as stream:
                data = stream.read()
        except Exception:  # botocore's errors: a console tail is a courtesy
            return None
        return console_tail(data[-CONSOLE_TAIL_BYTES:], cut=bool(names) or len(data) > CONSOLE_TAIL_BYTES)


def open_s3(uri: str, settings: S3Settings) -> S3Source:
    """An artifact.json or provisional record by its key, or the newest of them under a prefix."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise ConfigError(f"{uri}: expected s3://BUCKET/KEY")
    client = make_s3_client(settings)
    named = key.endswith(".json")
    prefix = key[: key.rfind("/") + 1] if named else (f"{key.rstrip('/')}/" if key else "")
    listing: dict[str, tuple[int, float]] | None = None
    raw = None if named else _get_if_present(client, bucket, prefix + ARTIFACT_FILE)
    if named:
        raw = get_bounded(client, bucket, key)
    elif raw is not None:
        key = prefix + ARTIFACT_FILE
    else:  # no verdict there: the attempt's newest provisional record
        listing = _listing(client, bucket, prefix)
        newest = newest_provisional(listing)
        if newest is None:
            raise ConfigError(f"no {ARTIFACT_FILE} or provisional record under s3://{bucket}/{prefix}")
        key = prefix + newest
        raw = get_bounded(client, bucket, key)
    artifact = parse_artifact(raw, f"s3://{bucket}/{key}")
    segments: dict[str, int] = {}
    if artifact.partial:
        listing = listing if listing is not None else _listing(client, bucket, prefix)
        segments = {name: listing[name][0] for name in sorted(listing) if SEGMENT_MARK in name}
        artifact = replace(artifact, last_evidence_unix=max((t for _, t in listing.values()), default=None))
    return S3Source(artifact, client=client, bucket=bucket, prefix=prefix, segments=segments)


def get_bounded(client: Any, bucket: str, key: str) -> bytes:
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        raw: bytes = body.read(ARTIFACT_LIMIT + 1)
    except Exception as exc:  # botocore's errors, as above
        raise SoakError(f"cannot read s3://{bucket}/{key}: {exc}") from exc
    if len(raw) > ARTIFACT_LIMIT:
        raise ConfigError(f"s3://{bucket}/{key} is larger than {ARTIFACT_LIMIT} bytes")
    return raw


def _get_if_present(client: Any, bucket: str, key: str) -> bytes | None:
    try:
        client.head_object(Bucket=bucket, Key=key)
    except Exception as exc:  # botocore's errors, as above
        if is_not_found(exc):
            return None
        raise SoakError(f"cannot read s3://{bucket}/{key}: {exc}") from exc
    return get_bounded(client, bucket, key)


def _listing(client: Any, bucket: str, prefix: str) -> dict[str, tuple[int, float]]:
    """Object name -> (size, LastModified) directly under ``prefix``, at most LISTING_LIMIT."""
    found: dict[str, tuple[int, float]] = {}
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/")
        for page in pages:
            for item in page.get("Contents", []):
                found[item["Key"][len(prefix) :]] = (int(item["Size"]), item["LastModified"].timestamp())
            if len(found) >= LISTING_LIMIT:
                break
    except Exception as exc:  # botocore's errors, as above
        raise SoakError(f"cannot list s3://{bucket}/{prefix}: {exc}") from exc
    return found


def open_source(location: str, settings: S3Settings) -> Source:
    if location.startswith("s3://"):
        return open_s3(location, settings)
    return open_local(Path(location))


def write_page(path: Path, page: str) -> None:
    """The page at ``path``, created or overwritten, never through a link: a symbolic link there
    (O_NOFOLLOW) or a second name of the file (a hard link) is an error, and so is anything but a
    regular file (a FIFO is not waited on)."""
    try:
        fd, _ = open_regular(path, flags=os.O_WRONLY | os.O_CREAT, single_name=True)
    except UnsafeFileError as exc:
        raise ConfigError(f"cannot write {path}: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror}") from exc
    try:
        os.ftruncate(fd, 0)  # only now: a refused file keeps its content
        write_fsync(fd, page.encode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)
