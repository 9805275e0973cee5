"""The progress probe on real directories, and with the liveness tracker on top of it."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from sidecar.adapters.progress import DirectoryProgressProbe
from sidecar.core.classification import Finding, Source
from sidecar.core.liveness import KIND_STALE, LivenessTracker
from sidecar.core.ports import ProgressProbe
from sidecar.core.samples import ProgressSample

pytestmark = pytest.mark.integration


def write(path: Path, data: bytes, mtime: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def test_missing_directory_is_an_empty_sample(tmp_path: Path) -> None:
    probe = DirectoryProgressProbe(tmp_path / "absent", exclude=[tmp_path / "absent" / "console.log"])
    assert probe.sample() == ProgressSample()


def test_counts_files_recursively(tmp_path: Path) -> None:
    write(tmp_path / "metrics.jsonl", b"x" * 10, mtime=1_000.0)
    write(tmp_path / "ckpt" / "step-1" / "model.bin", b"y" * 100, mtime=3_000.5)
    write(tmp_path / "ckpt" / "empty", b"", mtime=2_000.0)
    (tmp_path / "empty-dir").mkdir()

    sample = DirectoryProgressProbe(tmp_path, exclude=[]).sample()

    assert sample == ProgressSample(file_count=3, bytes_total=110, max_mtime=3_000.5)


def test_console_log_and_its_aliases_are_excluded(tmp_path: Path) -> None:
    write(tmp_path / "metrics.jsonl", b"x" * 10, mtime=1_000.0)
    console = tmp_path / "console.log"
    write(console, b"chatter" * 100, mtime=5_000.0)
    write(tmp_path / "console.log.1", b"old chatter" * 100, mtime=4_000.0)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "log-link").symlink_to(console)
    os.link(console, tmp_path / "hard-link")
    probe = DirectoryProgressProbe(tmp_path, exclude=[console, tmp_path / "console.log.1"])

    assert probe.sample() == ProgressSample(file_count=1, bytes_total=10, max_mtime=1_000.0)
    with console.open("ab") as log:
        log.write(b"more chatter")
    assert probe.sample() == ProgressSample(file_count=1, bytes_total=10, max_mtime=1_000.0)


def test_rotated_console_log_stays_excluded(tmp_path: Path) -> None:
    write(tmp_path / "metrics.jsonl", b"x" * 10, mtime=1_000.0)
    console = tmp_path / "console.log"
    probe = DirectoryProgressProbe(tmp_path, exclude=[console, tmp_path / "console.log.1"])
    write(console, b"first")
    assert probe.sample().file_count == 1
    console.rename(tmp_path / "console.log.1")
    write(console, b"second, a new inode")
    assert probe.sample() == ProgressSample(file_count=1, bytes_total=10, max_mtime=1_000.0)


def test_directory_symlinks_are_not_followed(tmp_path: Path) -> None:
    write(tmp_path / "a" / "f", b"abc", mtime=10.0)
    (tmp_path / "a" / "loop").symlink_to(tmp_path)
    assert DirectoryProgressProbe(tmp_path, exclude=[]).sample() == ProgressSample(
        file_count=1, bytes_total=3, max_mtime=10.0
    )


def test_files_vanishing_while_sampling_are_skipped(tmp_path: Path) -> None:
    write(tmp_path / "stable", b"s" * 7)
    stop = threading.Event()

    def churn() -> None:
        n = 0
        while not stop.is_set():
            target = tmp_path / "churn" / str(n % 5) / f"f{n}"
            write(target, b"z" * 3)
            target.unlink()
            if n % 10 == 0:
                target.parent.rmdir()
            n += 1

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        probe = DirectoryProgressProbe(tmp_path, exclude=[])
        for _ in range(300):
            sample = probe.sample()
            assert sample.file_count >= 1
            # A churn file may be caught between its creation and its write: 0 to 3 bytes.
            assert 7 <= sample.bytes_total <= 7 + 3 * (sample.file_count - 1)
    finally:
        stop.set()
        worker.join()


def test_console_log_growth_does_not_hide_a_stale_trainer(tmp_path: Path) -> None:
    """The seed's exclusion, end to end: the log grows, progress files do not, the soak is stale."""
    write(tmp_path / "metrics.jsonl", b"step 1\n", mtime=1_000.0)
    console = tmp_path / "console.log"
    probe: ProgressProbe = DirectoryProgressProbe(tmp_path, exclude=[console])
    tracker = LivenessTracker(startup_timeout_s=60.0, stale_progress_s=10.0, started_monotonic=0.0)

    verdicts = []
    for now in (0.0, 5.0, 10.0, 15.0):
        with console.open("ab") as log:
            log.write(b"still alive, honest\n")
        os.utime(console, (2_000.0 + now, 2_000.0 + now))
        verdicts.append(tracker.observe(probe.sample(), now))

    assert verdicts == [
        None,
        None,
        None,
        Finding(KIND_STALE, "training progress did not change for 15.0s", Source.SIDECAR),
    ]


# ---------------------------------------------------------------------- the trainer's run_summary


def test_read_file_reads_a_regular_file_bounded(tmp_path: Path) -> None:
    probe = DirectoryProgressProbe(tmp_path, exclude=[])
    (tmp_path / "run_summary.json").write_bytes(b"x" * 5000)
    found = probe.read_file("run_summary.json", 100)
    assert found is not None
    data, mtime = found
    assert data == b"x" * 101  # max_bytes + 1: enough to tell "too large" without reading it all
    assert mtime == (tmp_path / "run_summary.json").stat().st_mtime
    assert probe.read_file("absent.json", 100) is None


def test_read_file_never_follows_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "run_summary.json").symlink_to("/dev/zero")
    probe = DirectoryProgressProbe(tmp_path, exclude=[])
    with pytest.raises(OSError, match="symbolic link"):
        probe.read_file("run_summary.json", 100)


def test_read_file_refuses_what_is_not_a_regular_file_without_hanging(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "run_summary.json")  # no writer: a blocking open would never return
    (tmp_path / "summary-dir").mkdir()
    probe = DirectoryProgressProbe(tmp_path, exclude=[])
    with pytest.raises(OSError, match="not a regular file \\(a FIFO\\)"):
        probe.read_file("run_summary.json", 100)
    with pytest.raises(OSError, match="not a regular file \\(a directory\\)"):
        probe.read_file("summary-dir", 100)


def test_a_sample_looks_at_a_bounded_number_of_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The trainer decides how many files the progress dir holds; a sample's cost must not.
    monkeypatch.setattr("sidecar.adapters.progress.MAX_PROGRESS_ENTRIES", 10)
    for n in range(3):
        (tmp_path / f"d{n}").mkdir()
        for m in range(10):
            (tmp_path / f"d{n}" / f"f{m}").write_bytes(b"x")
    sample = DirectoryProgressProbe(tmp_path, exclude=[]).sample()
    assert 0 < sample.file_count <= 10 and sample.bytes_total == sample.file_count


def test_a_symlinked_file_is_not_the_trainers_progress(tmp_path: Path) -> None:
    """A link to a file the trainer does not write (the sidecar's heartbeat, rewritten every second)
    would look like progress while the trainer hangs: no link is followed."""
    outside = tmp_path / "run" / "sidecar.heartbeat"
    write(outside, b"1" * 50, mtime=9_000.0)
    progress = tmp_path / "progress"
    write(progress / "metrics.jsonl", b"x" * 10, mtime=1_000.0)
    (progress / "heartbeat-link").symlink_to(outside)
    sample = DirectoryProgressProbe(progress, exclude=[]).sample()
    assert (sample.file_count, sample.bytes_total, sample.max_mtime) == (1, 10, 1_000.0)


def test_a_progress_dir_that_is_a_link_is_not_walked(tmp_path: Path) -> None:
    write(tmp_path / "run" / "sidecar.heartbeat", b"1" * 50)
    (tmp_path / "progress").symlink_to(tmp_path / "run")
    assert DirectoryProgressProbe(tmp_path / "progress", exclude=[]).sample() == ProgressSample()
