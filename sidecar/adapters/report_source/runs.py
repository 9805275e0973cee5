"""A whole run's attempts for its page: a local run directory (``runs/<run-id>/``) or a run's
prefix in the bucket, each attempt's source and the run's ledger.

Folder names listed in the bucket become local directory names (each attempt's page is written
under one): only a plain name is taken, anything else is skipped and named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.adapters.report_source import (
    LISTING_LIMIT,
    RUN_ATTEMPTS_LIMIT,
    Source,
    get_bounded,
    open_local,
    open_s3,
    run_attempt_dirs,
)
from sidecar.adapters.s3_client import make_s3_client
from sidecar.core.artifact.objects import ARTIFACT_FILE, newest_provisional
from sidecar.core.errors import SoakError
from sidecar.core.ledger.record import LEDGER_FILE, LEDGER_LIMIT_BYTES, LEDGER_PIECES
from sidecar.core.publication import sanitize
from sidecar.launcher.protocol.files import read_regular
from sidecar.settings import S3Settings

# A folder name from the bucket becomes a local directory's name: one plain path component.
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")


@dataclass
class RunSources:
    """A run's attempts (each its name and source) and its ledger's bytes, when it has one."""

    run_id: str
    attempts: list[tuple[str, Source]]
    ledger: bytes | None
    ledger_where: str
    skipped: list[str] = field(default_factory=list)


def open_local_run(directory: Path) -> RunSources:
    """The run directory's attempts (a name that is no plain name, or an attempt that cannot be read,
    is skipped and named) and its ledger (an unreadable one is named, not shown)."""
    run = RunSources(directory.name, [], None, str(directory / LEDGER_FILE))
    for attempt in run_attempt_dirs(directory):
        if not SAFE_NAME.fullmatch(attempt.name):
            run.skipped.append(f"{sanitize(attempt.name, 200)} (not a plain name)")
            continue
        try:
            run.attempts.append((attempt.name, open_local(attempt)))
        except SoakError as exc:
            run.skipped.append(f"{attempt.name} ({exc})")
    try:
        run.ledger = read_regular(directory / LEDGER_FILE, LEDGER_LIMIT_BYTES)
    except FileNotFoundError:
        pass
    except OSError as exc:
        run.skipped.append(f"{LEDGER_FILE} ({exc})")
    return run


def s3_run_prefix(uri: str, settings: S3Settings) -> bool:
    """True when ``uri`` names a run's prefix in the bucket: its ledger, or attempt folders and no
    artifact of its own."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not bucket or key.endswith(".json"):
        return False
    prefix = f"{key.rstrip('/')}/" if key else ""
    client = make_s3_client(settings)
    folders, names = _folders(client, bucket, prefix)
    return LEDGER_FILE in names or (
        bool(folders) and ARTIFACT_FILE not in names and not newest_provisional(names)
    )


def open_s3_run(uri: str, settings: S3Settings) -> RunSources:
    """Every attempt folder under the run's prefix (its artifact, else its newest provisional
    record) and the run's ledger. A folder whose name could not be a local directory's, or that
    holds neither, is skipped and named."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    prefix = f"{key.rstrip('/')}/" if key else ""
    client = make_s3_client(settings)
    folders, names = _folders(client, bucket, prefix)
    run = RunSources(
        prefix.rstrip("/").rsplit("/", 1)[-1] or bucket, [], None, f"s3://{bucket}/{prefix}{LEDGER_FILE}"
    )
    if LEDGER_FILE in names:
        run.ledger = get_bounded(client, bucket, prefix + LEDGER_FILE)
    # The ledger's pieces are no attempt (the ledger itself is read above).
    for folder in [name for name in folders if name != LEDGER_PIECES][:RUN_ATTEMPTS_LIMIT]:
        if not SAFE_NAME.fullmatch(folder):
            run.skipped.append(f"{sanitize(folder, 200)} (not a name a local folder may have)")
            continue
        try:
            run.attempts.append((folder, open_s3(f"s3://{bucket}/{prefix}{folder}/", settings)))
        except SoakError as exc:
            run.skipped.append(f"{folder} ({exc})")
    return run


def _folders(client: Any, bucket: str, prefix: str) -> tuple[list[str], dict[str, tuple[int, float]]]:
    """The sub-folders directly under ``prefix`` (by name) and its objects (name -> size, time)."""
    folders: list[str] = []
    found: dict[str, tuple[int, float]] = {}
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/")
        for page in pages:
            folders += [p["Prefix"][len(prefix) :].rstrip("/") for p in page.get("CommonPrefixes", [])]
            for item in page.get("Contents", []):
                found[item["Key"][len(prefix) :]] = (int(item["Size"]), item["LastModified"].timestamp())
            if len(folders) + len(found) >= LISTING_LIMIT:
                break
    except Exception as exc:  # botocore's errors, as above
        raise SoakError(f"cannot list s3://{bucket}/{prefix}: {exc}") from exc
    return sorted(folders), found
