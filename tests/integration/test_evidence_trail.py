"""Evidence that survives a hard stop, against the real S3 server: a real local soak is SIGKILLed
at random points (its sidecar alone, or its whole process tree; after a SIGTERM or without one),
again and again on one run. After each kill, what the attempt left is checked:

- the provisional artifact, locally and in the bucket (once monitoring began);
- every sample taken more than one flush interval before the kill is in the bucket's segments,
  whose concatenation is byte for byte the start of the local samples file;
- a stop from outside that had a moment before the SIGKILL left "stopping" with its cause in S3;
- no object in the bucket was ever rewritten (each one's sha256 is what it was when first seen);
- the next attempt names every earlier one as ended without a verdict (``lost_attempts``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.fixtures.processes import Spawner
from tests.fixtures.s3 import REGION, SeaweedServer
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.s3]

POINTS = 30
FLUSH_S = 0.5
# Samples older than this at the kill must be in the bucket: one flush interval, and the time one
# flush of a few small objects may take on a loaded CI machine.
LOST_AT_MOST_S = FLUSH_S + 2.0
# A SIGTERM this long before the SIGKILL has had its "stopping" record sent.
STOPPING_SENT_WITHIN_S = 1.5

# A trainer that ignores the soft stop (so a SIGTERM leaves it in its stop grace) and prints a line
# and writes progress ten times a second.
TRAINER = (
    "import os, signal, time\n"
    "signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n"
    "progress = os.environ['SOAK_PROGRESS_DIR']\n"
    "for step in range(10**6):\n"
    "    print('step', step, flush=True)\n"
    "    with open(os.path.join(progress, 'progress'), 'a') as f:\n"
    "        f.write('x')\n"
    "    time.sleep(0.1)\n"
)


def _env(server: SeaweedServer, prefix: str) -> dict[str, str]:
    return {
        **os.environ,
        "SOAK_S3__BUCKET": server.bucket,
        "SOAK_S3__ENDPOINT_URL": server.endpoint,
        "SOAK_S3__REGION": REGION,
        "SOAK_S3__ADDRESSING_STYLE": "path",
        "SOAK_S3__PREFIX": prefix.rstrip("/"),
        "SOAK_EVIDENCE__FLUSH_S": str(FLUSH_S),
        "AWS_ACCESS_KEY_ID": server.access_key,
        "AWS_SECRET_ACCESS_KEY": server.secret_key,
    }


def _argv(tmp: Path, run_id: str) -> list[str]:
    return [
        sys.executable, "-m", "sidecar.cli", "run", "--local", "--run-id", run_id,
        "--output", str(tmp / "out"), "--run-dir", str(tmp / "run"), "--progress-dir", str(tmp / "progress"),
        "--deadline-dir", str(tmp / "deadlines"), "--sample-interval", "0.1", "--gpu-backend", "none",
        "--status", "off", "--stop-grace", "30", "--budget", "7200",
        "--", sys.executable, "-c", TRAINER,
    ]  # fmt: skip


def _gunzip_lines(data: bytes) -> list[dict[str, Any]]:
    """The complete lines of a gzip stream that may lack its end."""
    text = zlib.decompressobj(wbits=31).decompress(data).decode()
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def _dead(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class Bucket:
    """What the server holds for the run, and the first sha256 seen of every key."""

    def __init__(self, server: SeaweedServer, prefix: str) -> None:
        self._client = server.client()
        self._bucket = server.bucket
        self._prefix = prefix
        self.first_seen: dict[str, str] = {}

    def attempt(self, number: int) -> dict[str, bytes]:
        """Object name -> bytes under the attempt's prefix, each checked against its stored checksum."""
        listed = self._client.list_objects_v2(Bucket=self._bucket, Prefix=self._prefix)
        objects: dict[str, bytes] = {}
        for item in listed.get("Contents", []):
            key = item["Key"]
            got = self._client.get_object(Bucket=self._bucket, Key=key, ChecksumMode="ENABLED")
            data = got["Body"].read()
            digest = hashlib.sha256(data).hexdigest()
            assert got["Metadata"].get("sha256") == digest, f"{key}: stored bytes are not what was sent"
            assert self.first_seen.setdefault(key, digest) == digest, f"{key} was rewritten"
            folder, _, name = key.rpartition("/")
            if folder.endswith(f"/{number}-local"):
                objects[name] = data
        return objects


def _segments(objects: dict[str, bytes], stem: str) -> bytes:
    names = sorted(n for n in objects if n.startswith(f"{stem}.seg-"))
    return b"".join(objects[n] for n in names)


def _kill(
    proc: subprocess.Popen[bytes],
    rng: random.Random,
    point: int,
    *,
    sampling: Callable[[], bool],
    whole_tree: bool,
) -> tuple[float, float | None]:
    """SIGKILL the sidecar (or its whole tree) at a random point; every other point after a SIGTERM.
    Every third point falls in the sidecar's first seconds, counted from the spawn; the others in its
    first six seconds of monitoring, counted from its first samples on disk, so that a loaded machine's
    slow start cannot leave the test without points that had samples to lose.
    (when the SIGKILL went, when the SIGTERM did)"""
    if point % 3:
        wait_until("the attempt's first samples", sampling, 60, interval_s=0.02)
        time.sleep(1.0 + (point % 10) * 0.5 + rng.uniform(0.0, 0.5))
    else:
        time.sleep((point % 10) * 0.3 + rng.uniform(0.0, 0.5))
    termed = None
    if point % 2:
        proc.send_signal(signal.SIGTERM)
        termed = time.time()
        time.sleep(rng.uniform(0.0, 2.5))
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for member in family if whole_tree else family[:1]:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    killed = time.time()
    proc.wait(timeout=30)
    # Sidecar alone: its launcher, owner lost, ends the trainer and frees the run's lock.
    wait_until("the soak's processes gone", lambda: all(map(_dead, family)), 60)
    return killed, termed


def _check_attempt(attempt: Path, bucket: Bucket, killed: float, termed: float | None) -> set[str]:
    """Checks what the attempt left; what there was to check (so the test cannot pass on nothing)."""
    number = int(attempt.name.removeprefix("attempt-"))
    if not (attempt / "artifact.json").exists():
        return set()  # killed between the attempt's number and its first record
    local = json.loads((attempt / "artifact.json").read_text())
    assert local["status"] in ("running", "stopping"), local["status"]
    assert local["exit_code"] is None and local["context"]["attempt"] == number
    objects = bucket.attempt(number)
    samples_file = attempt / "samples.jsonl.gz"
    if not samples_file.exists():
        return {"record"}  # killed before monitoring: the record may not have been sent yet
    assert "provisional-0001.json" in objects, sorted(objects)
    first = json.loads(objects["provisional-0001.json"])
    assert first["status"] == "running" and first["context"]["attempt"] == number
    # The segments are the local file's first bytes; every sample older than a flush is in them.
    local_bytes = samples_file.read_bytes()
    sent = _segments(objects, "samples.jsonl.gz")
    assert local_bytes.startswith(sent)
    in_bucket = _gunzip_lines(sent) if sent else []
    taken = _gunzip_lines(local_bytes)
    assert in_bucket == taken[: len(in_bucket)]
    old = [s for s in taken if s["t_wall"] < killed - LOST_AT_MOST_S]
    assert len(in_bucket) >= len(old), (len(in_bucket), len(old), len(taken))
    checked = {"record", "samples"} if old else {"record"}
    # The console's segments are the start of what the trainer printed.
    console = _segments(objects, "console.log")
    assert console.startswith(b"step 0\n") or not console
    if termed is not None and local["status"] == "stopping" and killed - termed > STOPPING_SENT_WITHIN_S:
        records = sorted(n for n in objects if n.startswith("provisional-"))
        last = json.loads(objects[records[-1]])
        assert last["status"] == "stopping" and "SIGTERM" in last["failure_reason"], records
        checked.add("stopping")
    return checked


@pytest.mark.parametrize("whole_tree", [False, True], ids=["sidecar", "whole-tree"])
def test_a_hard_stop_at_any_point_loses_nothing_before_the_last_flush(
    tmp_path: Path, spawn: Spawner, seaweedfs: SeaweedServer, s3_prefix: str, whole_tree: bool
) -> None:
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    run_id = str(uuid.uuid4())
    (tmp_path / "progress").mkdir()
    env = _env(seaweedfs, s3_prefix)
    bucket = Bucket(seaweedfs, s3_prefix)
    runs = tmp_path / "out" / "runs" / run_id
    checked: dict[str, int] = {}
    for point in range(POINTS):
        before = set(runs.glob("attempt-*")) if runs.exists() else set()
        proc = spawn(_argv(tmp_path, run_id), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def sampling(before: set[Path] = before) -> bool:
            return any((a / "samples.jsonl.gz").exists() for a in set(runs.glob("attempt-*")) - before)

        killed, termed = _kill(proc, rng, point, sampling=sampling, whole_tree=whole_tree)
        for attempt in set(runs.glob("attempt-*")) - before if runs.exists() else ():
            try:
                for what in _check_attempt(attempt, bucket, killed, termed):
                    checked[what] = checked.get(what, 0) + 1
            except AssertionError as exc:
                raise AssertionError(f"seed {seed}, point {point}, {attempt.name}: {exc}") from exc
    # Enough of the points fell where there was something to lose.
    assert checked.get("samples", 0) >= POINTS // 5 and checked.get("stopping", 0) >= 2, (seed, checked)
    # Every attempt that was numbered names each earlier one that left a provisional artifact.
    numbered = sorted(int(p.name.removeprefix("attempt-")) for p in runs.glob("attempt-*"))
    assert len(numbered) >= POINTS // 2, f"seed {seed}: only {numbered} were numbered"
    provisional = {n for n in numbered if (runs / f"attempt-{n}" / "artifact.json").exists()}
    for number in sorted(provisional):
        document = json.loads((runs / f"attempt-{number}" / "artifact.json").read_text())
        lost = {each["attempt"] for each in document["lost_attempts"]}
        assert lost == {n for n in provisional if n < number}, f"seed {seed}: attempt {number} names {lost}"


def _report(target: str, out: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "report", target, "-o", str(out)],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out.read_text()


def test_a_killed_attempt_reads_back_as_partial_and_the_next_attempt_names_it(
    tmp_path: Path, spawn: Spawner, seaweedfs: SeaweedServer, s3_prefix: str
) -> None:
    run_id = str(uuid.uuid4())
    (tmp_path / "progress").mkdir()
    env = _env(seaweedfs, s3_prefix)
    client, bucket = seaweedfs.client(), seaweedfs.bucket
    folder = f"{s3_prefix}local/local/{run_id}/1-local/"

    def names() -> set[str]:
        listed = client.list_objects_v2(Bucket=bucket, Prefix=folder).get("Contents", [])
        return {item["Key"].removeprefix(folder) for item in listed}

    proc = spawn(_argv(tmp_path, run_id), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until("two flushes of samples", lambda: "samples.jsonl.gz.seg-000002" in names(), 60)
    family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGTERM)
    termed = time.monotonic()
    wait_until("the stopping record", lambda: "provisional-0002.json" in names(), 30, interval_s=0.005)
    print(f"SIGTERM to the stopping record in S3: {(time.monotonic() - termed) * 1000:.0f} ms")
    proc.kill()
    proc.wait(timeout=30)
    wait_until("the soak's processes gone", lambda: all(map(_dead, family)), 60)

    page = _report(f"s3://{bucket}/{folder}", tmp_path / "s3.html", env)
    assert "PARTIAL: no verdict (last evidence at " in page and '<span class="stopping">' in page
    assert page.count('<path class="series"') >= 5 and "step " in page
    local = _report(str(tmp_path / "out" / "runs" / run_id / "attempt-1"), tmp_path / "local.html", env)
    assert "PARTIAL: no verdict" in local and local.count('<path class="series"') >= 5

    # The next attempt says at once that attempt 1 ended without a verdict, and records it.
    argv = _argv(tmp_path, run_id)
    argv[argv.index("--stop-grace") + 1] = "0"
    second = spawn(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert second.stderr is not None
    told = b""
    while b"attempt 1 ended without a verdict" not in told:
        line = second.stderr.readline()
        assert line, told.decode()
        told += line
    assert b"it was stopping: soak was interrupted" in told and f"s3://{bucket}/{folder}".encode() in told
    second_folder = folder.replace("/1-local/", "/2-local/")
    segment_prefix = f"{second_folder}samples.jsonl.gz.seg-"
    wait_until(
        "a segment of attempt 2",
        lambda: bool(client.list_objects_v2(Bucket=bucket, Prefix=segment_prefix).get("Contents")),
        60,
    )
    second.send_signal(signal.SIGTERM)
    second.communicate(timeout=60)
    final = json.loads((tmp_path / "out" / "runs" / run_id / "attempt-2" / "artifact.json").read_text())
    assert final["status"] == "failed" and final["failure_classification"] == "external_cancellation"
    (lost,) = final["lost_attempts"]
    assert lost["attempt"] == 1 and lost["status"] == "stopping" and lost["last_evidence_at_utc"]
    # The final artifact lists the segments sent while the trainer ran, as the bucket holds them.
    segments = final["upload"]["segments"]
    assert any(segment["file"] == "samples.jsonl.gz" for segment in segments)
    for segment in segments:
        stored = client.get_object(Bucket=bucket, Key=f"{second_folder}{segment['name']}")["Body"].read()
        assert hashlib.sha256(stored).hexdigest() == segment["sha256"] and len(stored) == segment["size"]


ROTATING_TRAINER = (
    "import os, time\n"
    "progress = os.environ['SOAK_PROGRESS_DIR']\n"
    "for i in range(400):\n"
    "    print(f'line {i:06d} ' + 'z' * 1000, flush=True)\n"
    "    if i % 8 == 7:\n"
    "        with open(os.path.join(progress, 'progress'), 'a') as f:\n"
    "            f.write('x')\n"
    "        time.sleep(0.2)\n"
    "time.sleep(1)\n"
)


def test_console_segments_follow_the_launchers_rotation(
    tmp_path: Path, seaweedfs: SeaweedServer, s3_prefix: str
) -> None:
    """A 64 KiB console cap: the launcher rotates console.log to console.log.1 every 64 lines, and the
    kernel gives a freed inode number to the next console.log. Every line still reaches the segments
    (a segment of a file is never resumed at another file's offset)."""
    (tmp_path / "progress").mkdir()
    env = {
        **_env(seaweedfs, s3_prefix),
        "SOAK_EVIDENCE__FLUSH_S": "0.2",
        "SOAK_LAUNCHER__CONSOLE_LOG_BYTES": "65536",
    }
    argv = _argv(tmp_path, str(uuid.uuid4()))
    argv[argv.index("-c") + 1] = ROTATING_TRAINER
    done = subprocess.run(argv, env=env, capture_output=True, timeout=300, check=False)
    (path,) = (tmp_path / "out" / "runs").glob("*/attempt-1/artifact.json")
    artifact = json.loads(path.read_text())
    client = seaweedfs.client()
    printed: set[int] = set()
    segments = [s for s in artifact["upload"]["segments"] if s["file"].startswith("console.log")]
    assert any(s["file"] == "console.log.1" for s in segments), (done.stderr[-2000:], segments)
    for segment in segments:
        key = segment["uri"].removeprefix(f"s3://{seaweedfs.bucket}/")
        body = client.get_object(Bucket=seaweedfs.bucket, Key=key)["Body"].read()
        printed |= {int(n) for n in re.findall(rb"line (\d{6})", body)}
    assert sorted(set(range(400)) - printed) == []


def test_names_taken_by_other_bytes_are_passed_over(
    tmp_path: Path, spawn: Spawner, seaweedfs: SeaweedServer, s3_prefix: str
) -> None:
    """Objects planted at the attempt's first record and segment names (by anyone who can write the
    bucket) are kept as they are, and the evidence goes out under the next numbers."""
    run_id = str(uuid.uuid4())
    (tmp_path / "progress").mkdir()
    client, bucket = seaweedfs.client(), seaweedfs.bucket
    folder = f"{s3_prefix}local/local/{run_id}/1-local/"
    planted = ("provisional-0001.json", "samples.jsonl.gz.seg-000001", "console.log.seg-000001")
    for name in planted:
        client.put_object(Bucket=bucket, Key=folder + name, Body=b"planted")
    proc = spawn(_argv(tmp_path, run_id), env=_env(seaweedfs, s3_prefix), stdout=subprocess.DEVNULL)

    def stored(name: str) -> bytes | None:
        try:
            data: bytes = client.get_object(Bucket=bucket, Key=folder + name)["Body"].read()
        except client.exceptions.NoSuchKey:
            return None
        return data

    wait_until(
        "segments under the next numbers", lambda: stored("samples.jsonl.gz.seg-000002") is not None, 60
    )
    proc.kill()
    proc.wait(timeout=30)
    assert all(stored(name) == b"planted" for name in planted)
    record = stored("provisional-0002.json")
    assert record is not None and json.loads(record)["status"] == "running"
