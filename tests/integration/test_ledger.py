"""The run's ledger on a real S3 server (SeaweedFS): conditional writes that never lose an attempt
when two race, a damaged ledger left as it is, and two real local attempts of one run joined in
it, its budget published and its whole run rendered from the bucket."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sidecar.adapters import ledger_store
from sidecar.adapters.ledger_store import FOLD_OTHERS, PIECES, LocalLedgerStore, S3LedgerStore
from sidecar.app.ledger import slow_beside_other_indexes
from sidecar.app.values import RunRequest, Started
from sidecar.core.artifact.progress import ProgressInfo
from sidecar.core.errors import ConfigError, UploadError
from sidecar.core.ledger.record import (
    LEDGER_FILE,
    Ledger,
    LedgerEntry,
    dumps_ledger,
    parse_ledger,
    with_entry,
)
from sidecar.settings import S3Settings
from tests.fakes import Script, fakes
from tests.fixtures.s3 import SeaweedServer
from tests.integration.test_run_full import s3_env

pytestmark = pytest.mark.integration

T0 = 1_700_000_000.0


class FixedClock:
    def wall(self) -> float:
        return T0 + 1000

    def monotonic(self) -> float:
        return 0.0


def entry(attempt: int, status: str = "passed") -> LedgerEntry:
    return LedgerEntry(attempt, None, status, None, T0 + 100 * attempt, T0 + 100 * attempt + 50, ())


def adding(run_id: str, each: LedgerEntry) -> Callable[[Ledger | None], Ledger]:
    return lambda ledger: with_entry(ledger, each, run_id=run_id, deadline_started_unix=T0)


@pytest.mark.s3
def test_two_attempts_racing_for_the_ledger_both_land(seaweedfs: SeaweedServer) -> None:
    run_id, prefix = str(uuid.uuid4()), f"race-{uuid.uuid4().hex[:8]}/"
    second = S3LedgerStore(seaweedfs.settings(), FixedClock(), client_factory=seaweedfs.factory())
    folds: list[str] = []

    def racing_factory(settings: S3Settings) -> Any:
        client = seaweedfs.factory()(settings)
        put = client.put_object

        def put_object(**kwargs: Any) -> Any:
            if kwargs["Key"] == prefix + LEDGER_FILE:
                folds.append("IfMatch" if "IfMatch" in kwargs else "IfNoneMatch")
                if len(folds) == 1:  # between our read and our write, another attempt writes
                    second.update(run_id, prefix, adding(run_id, entry(2)))
            return put(**kwargs)

        client.put_object = put_object  # type: ignore[method-assign]
        return client

    first = S3LedgerStore(seaweedfs.settings(), FixedClock(), client_factory=racing_factory)
    written = first.update(run_id, prefix, adding(run_id, entry(1, "failed")))
    assert folds == ["IfNoneMatch", "IfMatch"]  # lost the race, read again, folded onto the winner
    assert [e.attempt for e in written.entries] == [1, 2]
    stored = first.read(run_id, prefix)
    assert stored is not None and [e.attempt for e in stored.entries] == [1, 2]
    client = seaweedfs.client()
    assert "Contents" not in client.list_objects_v2(Bucket=seaweedfs.bucket, Prefix=prefix + PIECES)
    doc = json.loads(client.get_object(Bucket=seaweedfs.bucket, Key=prefix + LEDGER_FILE)["Body"].read())
    head = client.head_object(Bucket=seaweedfs.bucket, Key=prefix + LEDGER_FILE, ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] and head["ContentType"] == "application/json"  # the store checked the bytes
    # attempt 1 (no phases told: all of it) and the wait until attempt 2, charged to what ended it
    assert doc["budget"]["badput_s"]["failed"] == pytest.approx(100)


@pytest.mark.s3
def test_many_attempts_ending_at_once_all_land_and_planted_pieces_are_passed_over(
    seaweedfs: SeaweedServer,
) -> None:
    """Every writer's piece lands with one unconditional create; the folds that lose their races
    leave pieces that every read still takes. A planted piece is never folded nor deleted."""
    run_id, prefix = str(uuid.uuid4()), f"many-{uuid.uuid4().hex[:8]}/"
    client = seaweedfs.client()
    planted = prefix + PIECES + "planted.json"
    client.put_object(Bucket=seaweedfs.bucket, Key=planted, Body=b'{"schema": "forged"}')
    stores = [
        S3LedgerStore(seaweedfs.settings(), FixedClock(), client_factory=seaweedfs.factory())
        for _ in range(24)
    ]
    barrier = threading.Barrier(len(stores))
    failures: list[BaseException] = []

    def end(number: int, store: S3LedgerStore) -> None:
        barrier.wait(30)
        try:
            store.update(run_id, prefix, adding(run_id, entry(number)))
        except Exception as exc:  # the outcome under test: asserted below
            failures.append(exc)

    threads = [threading.Thread(target=end, args=(n + 1, s)) for n, s in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures
    stored = stores[0].read(run_id, prefix)
    assert stored is not None and [e.attempt for e in stored.entries] == list(range(1, 25))
    left = client.list_objects_v2(Bucket=seaweedfs.bucket, Prefix=prefix + PIECES).get("Contents", [])
    assert planted in [item["Key"] for item in left]
    # One more attempt folds what the race left (at most FOLD_OTHERS of it) into ledger.json.
    stores[0].update(run_id, prefix, adding(run_id, entry(25)))
    folded = parse_ledger(
        client.get_object(Bucket=seaweedfs.bucket, Key=prefix + LEDGER_FILE)["Body"].read(), ""
    )
    assert len(folded.entries) >= min(25, len(stored.entries) - len(left) + 2 + FOLD_OTHERS)


@pytest.mark.s3
def test_a_damaged_ledger_is_left_as_it_is(seaweedfs: SeaweedServer) -> None:
    run_id, prefix = str(uuid.uuid4()), f"damaged-{uuid.uuid4().hex[:8]}/"
    client = seaweedfs.client()
    client.put_object(Bucket=seaweedfs.bucket, Key=prefix + LEDGER_FILE, Body=b'{"schema": "forged"}')
    store = S3LedgerStore(seaweedfs.settings(), FixedClock(), client_factory=seaweedfs.factory())
    with pytest.raises(ConfigError, match="schema"):
        store.update(run_id, prefix, adding(run_id, entry(1)))
    assert (
        client.get_object(Bucket=seaweedfs.bucket, Key=prefix + LEDGER_FILE)["Body"].read()
        == b'{"schema": "forged"}'
    )


def test_the_local_ledger_is_never_written_through_a_link(tmp_path: Path) -> None:
    run_id = str(uuid.uuid4())
    (tmp_path / run_id).mkdir()
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    (tmp_path / run_id / LEDGER_FILE).symlink_to(target)
    with pytest.raises(ConfigError):
        LocalLedgerStore(tmp_path, FixedClock()).update(run_id, "", adding(run_id, entry(1)))
    assert target.read_text() == "{}"


def test_a_run_directory_locked_by_someone_else_is_given_up_on_not_waited_for(tmp_path: Path) -> None:
    run_id = str(uuid.uuid4())
    (tmp_path / run_id).mkdir()
    fd = os.open(tmp_path / run_id, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a trainer running as the same user could, forever
        store = LocalLedgerStore(tmp_path, FixedClock(), lock_wait_s=0.3)
        with pytest.raises(UploadError, match="stayed locked"):
            store.update(run_id, "", adding(run_id, entry(1)))
    finally:
        os.close(fd)
    written = LocalLedgerStore(tmp_path, FixedClock()).update(run_id, "", adding(run_id, entry(1)))
    assert [e.attempt for e in written.entries] == [1]


def soak(tmp: Path, run_id: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sidecar.examples.trainer", "--steps", "6", "--step-s", "0.1"]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sidecar.cli",
            "run",
            "--local",
            "--run-id",
            run_id,
            "--budget",
            "600",
            "--",
            *command,
        ],
        cwd=tmp,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.s3
def test_two_real_attempts_of_one_run_share_one_ledger_and_one_page(
    tmp_path: Path, seaweedfs: SeaweedServer
) -> None:
    run_id = str(uuid.uuid4())
    env = {
        **s3_env(seaweedfs),
        "SOAK_GPU__BACKEND": "none",
        "SOAK_MONITOR__SAMPLE_INTERVAL_S": "0.2",
        "SOAK_MONITOR__POST_SHUTDOWN_GRACE_S": "0.2",
        "SOAK_MONITOR__STATUS_LINE": "off",
    }
    failed = soak(tmp_path, run_id, {**env, "SOAK_MONITOR__MIN_DURATION_S": "100"})
    assert failed.returncode != 0, failed.stderr
    passed = soak(tmp_path, run_id, env)
    assert passed.returncode == 0, passed.stderr
    told = re.search(r"goodput ([0-9.]+)% since the deadline's start .*; ledger (s3://\S+)", passed.stderr)
    assert told is not None, passed.stderr
    key = told.group(2).removeprefix(f"s3://{seaweedfs.bucket}/")
    assert key == f"soak/local/local/{run_id}/{LEDGER_FILE}"
    doc = json.loads(seaweedfs.client().get_object(Bucket=seaweedfs.bucket, Key=key)["Body"].read())
    assert [(a["attempt"], a["status"], a["classification"]) for a in doc["attempts"]] == [
        (1, "failed", "trainer_failure"),
        (2, "passed", None),
    ]
    assert abs(doc["budget"]["goodput"] * 100 - float(told.group(1))) < 0.1
    assert doc["budget"]["badput_s"]["trainer_failure"] > 0  # the restart, charged to what ended attempt 1
    local = json.loads((tmp_path / "soak-output" / "runs" / run_id / LEDGER_FILE).read_text())
    assert [a["attempt"] for a in local["attempts"]] == [1, 2]

    out = tmp_path / "from-s3"
    page = subprocess.run(
        [
            sys.executable,
            "-m",
            "sidecar.cli",
            "report",
            told.group(2).removesuffix(LEDGER_FILE),
            "-o",
            str(out),
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert page.returncode == 0, page.stderr
    assert "skipped" not in page.stderr, page.stderr  # the ledger's pieces are no attempt
    html = (out / "report.html").read_text()
    links = re.findall(r'href="([^"]+)"', html)
    assert links == ["./attempts/1-local/report.html", "./attempts/2-local/report.html"], links
    assert all((out / link).is_file() for link in links)
    assert f"goodput {float(told.group(1)):.1f}%" in html


def test_nothing_planted_in_the_run_directory_is_opened_waited_on_or_truncated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FIFO or a hard link to another file where the ledger's new file would go: a local trainer
    could plant both. The write takes another name: no hang, the other file untouched."""
    run_id = str(uuid.uuid4())
    directory = tmp_path / run_id
    directory.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    os.mkfifo(directory / f".{LEDGER_FILE}.aaaa.tmp")
    os.link(victim, directory / f".{LEDGER_FILE}.bbbb.tmp")
    names = iter(["aaaa", "bbbb", "cccc"])
    monkeypatch.setattr("sidecar.adapters.ledger_store.secrets.token_hex", lambda _: next(names))
    written = LocalLedgerStore(tmp_path, FixedClock()).update(run_id, "", adding(run_id, entry(1)))
    assert [e.attempt for e in written.entries] == [1] and victim.read_text() == "mine"
    assert LocalLedgerStore(tmp_path, FixedClock()).read(run_id, "") is not None


def test_a_run_page_skips_what_it_cannot_trust_and_names_it(tmp_path: Path) -> None:
    """A run directory a local trainer could write: an attempt folder named as a link scheme, a
    damaged attempt, another run's ledger. Each is skipped and named; the page is still written."""
    run_id = str(uuid.uuid4())
    env = {
        "SOAK_GPU__BACKEND": "none",
        "SOAK_MONITOR__STATUS_LINE": "off",
        "SOAK_MONITOR__SAMPLE_INTERVAL_S": "0.2",
    }
    assert soak(tmp_path, run_id, env).returncode == 0
    runs = tmp_path / "soak-output" / "runs" / run_id
    shutil.copytree(runs / "attempt-1", runs / "javascript:alert(1)")
    shutil.copytree(runs / "attempt-1", runs / "attempt-9")
    (runs / "attempt-9" / "samples.jsonl.gz").unlink()
    ledger = json.loads((runs / LEDGER_FILE).read_text())
    (runs / LEDGER_FILE).write_text(json.dumps({**ledger, "run_id": "another"}))
    done = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "report", str(runs)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    html = (runs / "report.html").read_text()
    assert re.findall(r'href="([^"]+)"', html) == ["./attempt-1/report.html"]
    assert "skipped javascript:alert(1) (not a plain name)" in done.stderr
    assert (
        "skipped attempt-9 (" in done.stderr and "the ledger is not shown: it is run another's" in done.stderr
    )


@pytest.mark.s3
def test_a_read_takes_a_bounded_amount_of_pieces_and_says_when_there_are_more(
    seaweedfs: SeaweedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pieces anyone who can write the bucket could plant by the thousand: an oversized one is never
    read (its listed size), and pieces of the run beyond a ledger's worth fail the read rather than
    being dropped from it."""
    run_id, prefix = str(uuid.uuid4()), f"bounded-{uuid.uuid4().hex[:8]}/"
    client = seaweedfs.client()
    oversized = b" " * (ledger_store.PIECE_LIMIT_BYTES + 1)
    client.put_object(Bucket=seaweedfs.bucket, Key=f"{prefix}{PIECES}0-huge.json", Body=oversized)
    for number in range(1, 6):
        piece = dumps_ledger(adding(run_id, entry(number))(None), now=T0)
        client.put_object(Bucket=seaweedfs.bucket, Key=f"{prefix}{PIECES}{number}.json", Body=piece)
    store = S3LedgerStore(seaweedfs.settings(), FixedClock(), client_factory=seaweedfs.factory())
    stored = store.read(run_id, prefix)
    assert stored is not None and [e.attempt for e in stored.entries] == [1, 2, 3, 4, 5]
    monkeypatch.setattr(ledger_store, "PIECES_LIMIT_BYTES", 2 * len(piece))
    with pytest.raises(ConfigError, match="exceed"):
        store.read(run_id, prefix)


@pytest.mark.s3
def test_planted_pieces_neither_replace_an_attempts_own_entry_nor_stop_the_folds(
    seaweedfs: SeaweedServer,
) -> None:
    run_id, prefix = str(uuid.uuid4()), f"planted-{uuid.uuid4().hex[:8]}/"
    client = seaweedfs.client()
    for n in range(FOLD_OTHERS + 2):  # junk older than everything: it must not hold the fold's window
        client.put_object(Bucket=seaweedfs.bucket, Key=f"{prefix}{PIECES}junk-{n}.json", Body=b"x")
    forged = dumps_ledger(adding(run_id, entry(3, "passed"))(None), now=T0)  # a verdict planted beforehand
    client.put_object(Bucket=seaweedfs.bucket, Key=f"{prefix}{PIECES}forged.json", Body=forged)
    leftover = dumps_ledger(adding(run_id, entry(1, "failed"))(None), now=T0)  # a writer that lost its folds
    client.put_object(Bucket=seaweedfs.bucket, Key=f"{prefix}{PIECES}leftover.json", Body=leftover)
    store = S3LedgerStore(seaweedfs.settings(), FixedClock(), client_factory=seaweedfs.factory())
    written = store.update(run_id, prefix, adding(run_id, entry(3, "failed")))
    assert [(e.attempt, e.status) for e in written.entries] == [(1, "failed"), (3, "failed")]
    body = client.get_object(Bucket=seaweedfs.bucket, Key=prefix + LEDGER_FILE)["Body"].read()
    assert [(e.attempt, e.status) for e in parse_ledger(body, "ledger.json").entries] == [
        (1, "failed"),
        (3, "failed"),
    ]
    stored = store.read(run_id, prefix)
    assert stored is not None and [(e.attempt, e.status) for e in stored.entries] == [
        (1, "failed"),
        (3, "failed"),
    ]


def test_a_slow_index_finds_itself_slow_against_the_others_in_the_ledger(tmp_path: Path) -> None:
    """What the slow index's artifact says: its mean rate against the other indexes' entries in the
    run's ledger as it ends; the fast index, against the slow one's, says nothing."""
    run_id = str(uuid.uuid4())
    (tmp_path / run_id).mkdir()
    store = LocalLedgerStore(tmp_path, FixedClock())
    ports = replace(fakes(Script(), b"{}").ports(), ledgers=(store,))
    fast = replace(entry(1), index=0, steps_per_s=10.0, node="node-a")
    store.update(run_id, "", adding(run_id, fast))

    def started(index: int) -> Started:
        request = RunRequest("pod", run_id, context={"node": f"node-{index}"}, index=index, indexes=2)
        return Started(request, wall=0.0, monotonic=0.0, attempt=1)

    said = slow_beside_other_indexes(ports, started(1), "", ProgressInfo(mean_steps_per_s=7.0))
    assert (
        said == "index 1 on node node-1 ran at 7 steps/s, 0.70x the median of the other indexes (10 steps/s)"
    )
    store.update(run_id, "", adding(run_id, replace(entry(1), index=1, steps_per_s=7.0)))
    assert slow_beside_other_indexes(ports, started(0), "", ProgressInfo(mean_steps_per_s=10.0)) is None
    # A single-pod soak, or a trainer without progress records, is compared with nothing.
    single = Started(RunRequest("pod", run_id), wall=0.0, monotonic=0.0, attempt=1)
    assert slow_beside_other_indexes(ports, single, "", ProgressInfo(mean_steps_per_s=1.0)) is None
    assert slow_beside_other_indexes(ports, started(1), "", ProgressInfo()) is None
