"""The product on S3-compatible stores that lack what the deadline relies on: SeaweedFS (everything),
moto in server mode (conditional writes, no checksums), s3rver (neither), and SeaweedFS behind a
gateway that drops the conditional or the checksum headers, or corrupts what is read back.

Each store either holds every guarantee (one supervisor, attempt numbers never reused, evidence
never overwritten) or is refused before a trainer starts, naming the missing feature."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.adapters.s3_store import probe
from sidecar.core.exitcodes import ExitCode
from tests.fixtures.s3 import SeaweedServer
from tests.fixtures.s3_proxy import Mode, S3Proxy
from tests.fixtures.s3_servers import S3Endpoint

pytestmark = [pytest.mark.integration, pytest.mark.s3]

ALL = {
    "conditional_create": True,
    "conditional_put": True,
    "conditional_delete": True,
    "conditional_complete": True,
    "checksum_checked": True,
    "checksum_echoed": True,
}
NO_CONDITIONALS = {name: name.startswith("checksum") for name in ALL}
NO_CHECKSUMS = {name: not name.startswith("checksum") for name in ALL}
NONE = dict.fromkeys(ALL, False)
# What each store honours (the closing note's table).
EXPECTED = {
    "seaweedfs": ALL,
    "moto": NO_CHECKSUMS,
    "s3rver": NONE,
    "seaweedfs+drop_conditionals": NO_CONDITIONALS,
    "seaweedfs+drop_checksums": NO_CHECKSUMS,
}


def _seaweed(server: SeaweedServer) -> S3Endpoint:
    return S3Endpoint("seaweedfs", server.endpoint, server.bucket, server.access_key, server.secret_key)


@contextlib.contextmanager
def _behind(server: SeaweedServer, mode: Mode, flip_only: str = "") -> Iterator[S3Endpoint]:
    with S3Proxy(
        server.endpoint, mode, credentials=(server.access_key, server.secret_key), flip_only=flip_only
    ) as proxy:
        yield S3Endpoint(
            f"seaweedfs+{mode}", proxy.endpoint, server.bucket, server.access_key, server.secret_key
        )


@pytest.fixture(params=sorted(EXPECTED))
def store(request: pytest.FixtureRequest, seaweedfs: SeaweedServer) -> Iterator[S3Endpoint]:
    name: str = request.param
    if name == "seaweedfs":
        yield _seaweed(seaweedfs)
    elif name in ("moto", "s3rver"):
        yield request.getfixturevalue("moto_server" if name == "moto" else "s3rver")
    else:
        with _behind(
            seaweedfs, "drop_conditionals" if name.endswith("conditionals") else "drop_checksums"
        ) as proxy:
            yield proxy


def start_soak(
    tmp: Path, server: S3Endpoint, run_id: str, *, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``soak-sidecar run --local`` as a user runs it, its deadline record and lock in the store;
    its trainer leaves ``trainer-ran`` in ``tmp`` the moment it starts."""
    settings = {
        **server.env(),
        "SOAK_DEADLINE__STORE": "s3",
        "SOAK_S3__MAX_ATTEMPTS": "2",
        "SOAK_MONITOR__SAMPLE_INTERVAL_S": "0.2",
        "SOAK_MONITOR__POST_SHUTDOWN_GRACE_S": "0.2",
        "SOAK_MONITOR__STATUS_LINE": "off",
        **(env or {}),
    }
    marker = tmp / "trainer-ran"
    argv = [
        sys.executable, "-m", "sidecar.cli", "run", "--local", "--run-id", run_id, "--budget", "600",
        "--checkpoint-margin", "10", "--gpu-backend", "none",
        "--", sys.executable, "-c",
        f"import pathlib, runpy, sys; pathlib.Path({str(marker)!r}).touch(); "
        "sys.argv = ['trainer', '--steps', '3', '--step-s', '0.05']; "
        "runpy.run_module('sidecar.examples.trainer', run_name='__main__')",
    ]  # fmt: skip
    tmp.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        argv,
        cwd=tmp,
        env={**os.environ, **settings},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def soak(
    tmp: Path, server: S3Endpoint, run_id: str, *, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return finished(start_soak(tmp, server, run_id, env=env))


def artifacts(tmp: Path, run_id: str) -> list[dict[str, Any]]:
    found = sorted((tmp / "soak-output" / "runs" / run_id).glob("*/artifact.json"))
    return [json.loads(path.read_text(encoding="utf-8")) for path in found]


def listed(server: S3Endpoint, prefix: str) -> list[str]:
    answer = server.client().list_objects_v2(Bucket=server.bucket, Prefix=prefix)
    return [item["Key"] for item in answer.get("Contents", [])]


def test_the_probe_finds_what_each_store_honours(store: S3Endpoint) -> None:
    prefix = f"probe-test/{uuid.uuid4().hex}.probe/"
    found = probe.probed(store.client(), store.settings(), prefix)
    shown = {name: getattr(found, name) for name in ALL}
    assert shown == EXPECTED[store.name]
    assert found.requests in (10, 11) and found.elapsed_ms > 0
    assert listed(store, prefix) == []  # the probe leaves nothing behind


@pytest.mark.parametrize("name", ["s3rver", "seaweedfs+drop_conditionals"])
def test_a_store_without_conditional_writes_is_refused_before_any_trainer_starts(
    tmp_path: Path, name: str, seaweedfs: SeaweedServer, request: pytest.FixtureRequest
) -> None:
    run_id = str(uuid.uuid4())
    with contextlib.ExitStack() as stack:
        server = (
            request.getfixturevalue("s3rver")
            if name == "s3rver"
            else stack.enter_context(_behind(seaweedfs, "drop_conditionals"))
        )
        # Two supervisors of one run at once: on such a store both would run the trainer.
        first, second = (finished(proc) for proc in [start_soak(tmp_path / x, server, run_id) for x in "ab"])
        for done in (first, second):
            assert done is not None and done.returncode == ExitCode.USAGE, done
            line = done.stderr.strip().splitlines()[-1]
            assert "does not honour conditional writes (PutObject If-None-Match: *" in line, line
            assert server.endpoint in line and "one supervisor per run" in line
        assert not (tmp_path / "a" / "trainer-ran").exists() and not (tmp_path / "b" / "trainer-ran").exists()
        assert listed(server, f"soak-deadlines/{run_id}") == []  # no record, no lease, no claim


@pytest.mark.parametrize("name", ["moto", "seaweedfs+drop_checksums"])
def test_a_store_that_does_not_confirm_checksums_is_refused_unless_accepted(
    tmp_path: Path, name: str, seaweedfs: SeaweedServer, request: pytest.FixtureRequest
) -> None:
    run_id = str(uuid.uuid4())
    with contextlib.ExitStack() as stack:
        server = (
            request.getfixturevalue("moto_server")
            if name == "moto"
            else stack.enter_context(_behind(seaweedfs, "drop_checksums"))
        )
        refused = soak(tmp_path, server, run_id)
        assert refused.returncode == ExitCode.USAGE, refused.stderr
        assert "does not confirm SHA-256 checksums" in refused.stderr
        assert "SOAK_S3__ACCEPT_UNVERIFIED_CHECKSUMS" in refused.stderr
        assert not (tmp_path / "trainer-ran").exists()

        accepted = {"SOAK_S3__ACCEPT_UNVERIFIED_CHECKSUMS": "true"}
        # Accepted, every guarantee that rests on conditional writes still holds: a resume is
        # attempt 2, and the first attempt's evidence stays as it was.
        assert soak(tmp_path, server, run_id, env=accepted).returncode == 0
        assert soak(tmp_path, server, run_id, env=accepted).returncode == 0
        first, second = artifacts(tmp_path, run_id)
        assert (first["context"]["attempt"], second["context"]["attempt"]) == (1, 2)
        assert first["upload"]["checksums_unverified"] and second["upload"]["checksums_unverified"]
        stored = server.client().get_object(
            Bucket=server.bucket, Key=_key(first["upload"]["uris"]["artifact.json"])
        )
        assert json.loads(stored["Body"].read())["context"]["attempt"] == 1
        report = subprocess.run(
            [
                sys.executable,
                "-m",
                "sidecar.cli",
                "report",
                first["upload"]["uris"]["artifact.json"],
                "-o",
                str(tmp_path / "r.html"),
            ],
            env={**os.environ, **server.env()},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert report.returncode == 0, report.stderr
        assert "did not confirm the uploads' SHA-256 (unverified)" in report.stderr
        assert "uploads unverified" in (tmp_path / "r.html").read_text(encoding="utf-8")


def _key(uri: str) -> str:
    return uri.removeprefix("s3://").partition("/")[2]


def test_seaweedfs_holds_every_guarantee_and_the_report_verifies_what_it_read(
    tmp_path: Path, seaweedfs: SeaweedServer
) -> None:
    server, run_id = _seaweed(seaweedfs), str(uuid.uuid4())
    assert soak(tmp_path, server, run_id).returncode == 0
    assert soak(tmp_path, server, run_id).returncode == 0
    first, second = artifacts(tmp_path, run_id)
    assert (first["context"]["attempt"], second["context"]["attempt"]) == (1, 2)
    assert not first["upload"]["checksums_unverified"]
    uri = first["upload"]["uris"]["artifact.json"]
    clean = _report(tmp_path / "clean.html", uri, server.env())
    assert clean.returncode == 0 and "does not match" not in clean.stderr, clean.stderr

    # Changed in the bucket after the upload (an unconditional PUT by someone else).
    samples_key = _key(first["upload"]["uris"]["samples.jsonl.gz"])
    seaweedfs.client().put_object(Bucket=server.bucket, Key=samples_key, Body=_gzip_lines(3))
    changed = _report(tmp_path / "changed.html", uri, server.env())
    assert changed.returncode == 0, changed.stderr
    assert (
        f"s3://{server.bucket}/{samples_key} does not match the SHA-256 its artifact recorded"
        in changed.stderr
    )
    assert "EVIDENCE NOT MATCHING" in (tmp_path / "changed.html").read_text(encoding="utf-8")


def test_evidence_corrupted_on_the_way_back_is_named_by_the_report(
    tmp_path: Path, seaweedfs: SeaweedServer
) -> None:
    server, run_id = _seaweed(seaweedfs), str(uuid.uuid4())
    assert soak(tmp_path, server, run_id).returncode == 0
    (artifact,) = artifacts(tmp_path, run_id)
    with _behind(seaweedfs, "flip_response_bodies", flip_only="samples.jsonl.gz") as gateway:
        uri = artifact["upload"]["uris"]["artifact.json"]
        done = _report(tmp_path / "flipped.html", uri, gateway.env())
    assert done.returncode == 0, done.stderr
    assert "samples.jsonl.gz does not match the SHA-256 its artifact recorded" in done.stderr


def _report(out: Path, uri: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "report", uri, "-o", str(out)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _gzip_lines(count: int) -> bytes:
    import gzip

    lines = "".join(json.dumps({"t_wall": 1.0 + n, "t_mono": float(n)}) + "\n" for n in range(count))
    return gzip.compress(lines.encode())
