"""The seed's liveness rules with injected times: every test fails if its rule is removed."""

from __future__ import annotations

import pytest

from sidecar.core.classification import Finding, Source
from sidecar.core.liveness import KIND_STALE, KIND_STARTUP, LivenessTracker
from sidecar.core.samples import ProgressSample

NOTHING = ProgressSample()


def progress(bytes_total: int, file_count: int = 1, max_mtime: float = 1000.0) -> ProgressSample:
    return ProgressSample(file_count=file_count, bytes_total=bytes_total, max_mtime=max_mtime)


def test_startup_timeout_fires_only_after_the_timeout() -> None:
    tracker = LivenessTracker(startup_timeout_s=10.0, stale_progress_s=5.0, started_monotonic=100.0)
    assert tracker.observe(NOTHING, 105.0) is None
    assert tracker.observe(NOTHING, 110.0) is None  # the seed's rule is strictly "more than"
    assert tracker.observe(NOTHING, 110.5) == Finding(
        KIND_STARTUP,
        "training produced no progress artifact within 10.0s",
        Source.SIDECAR,
    )


def test_empty_files_are_not_progress() -> None:
    tracker = LivenessTracker(startup_timeout_s=10.0, stale_progress_s=5.0, started_monotonic=0.0)
    empty = ProgressSample(file_count=3, bytes_total=0, max_mtime=5.0)
    assert tracker.observe(empty, 11.0) == Finding(
        KIND_STARTUP,
        "training produced no progress artifact within 10.0s",
        Source.SIDECAR,
    )


def test_first_progress_ends_the_startup_phase() -> None:
    tracker = LivenessTracker(startup_timeout_s=10.0, stale_progress_s=50.0, started_monotonic=0.0)
    assert tracker.observe(progress(1), 9.0) is None
    assert tracker.observe(progress(1), 30.0) is None  # past the startup timeout, not stale yet


def test_stale_after_progress_is_measured_from_the_last_change() -> None:
    tracker = LivenessTracker(startup_timeout_s=100.0, stale_progress_s=5.0, started_monotonic=0.0)
    assert tracker.observe(progress(10), 1.0) is None
    assert tracker.observe(progress(10), 6.0) is None
    assert tracker.observe(progress(10), 6.5) == Finding(
        KIND_STALE,
        "training progress did not change for 5.5s",
        Source.SIDECAR,
    )


@pytest.mark.parametrize(
    "changed",
    [
        progress(20),  # the seed's signal: bytes_total changed
        progress(10, file_count=2),  # a file appeared (same total size)
        progress(10, max_mtime=1001.0),  # a fixed-size heartbeat was rewritten
    ],
    ids=["bytes", "file_count", "mtime"],
)
def test_by_default_any_change_of_the_progress_signature_resets_staleness(changed: ProgressSample) -> None:
    tracker = LivenessTracker(startup_timeout_s=100.0, stale_progress_s=5.0, started_monotonic=0.0)
    assert tracker.observe(progress(10), 0.0) is None
    assert tracker.observe(changed, 4.0) is None
    assert tracker.observe(changed, 8.0) is None  # 4 s after the change, 8 s after the start
    assert tracker.last_progress_age(8.0) == 4.0
    assert tracker.observe(changed, 9.5) == Finding(
        KIND_STALE, "training progress did not change for 5.5s", Source.SIDECAR
    )


@pytest.mark.parametrize(
    "same_bytes",
    [progress(10, file_count=2), progress(10, max_mtime=1001.0)],
    ids=["file_count", "mtime"],
)
def test_with_the_seeds_signal_only_a_change_of_bytes_is_progress(same_bytes: ProgressSample) -> None:
    tracker = LivenessTracker(
        startup_timeout_s=100.0, stale_progress_s=5.0, started_monotonic=0.0, signal="bytes"
    )
    assert tracker.observe(progress(10), 0.0) is None
    assert tracker.observe(same_bytes, 4.0) is None
    assert tracker.observe(same_bytes, 5.5) == Finding(
        KIND_STALE, "training progress did not change for 5.5s", Source.SIDECAR
    )


def test_files_back_to_zero_bytes_are_no_progress_and_the_stale_timer_runs_on() -> None:
    """The seed put an emptied dir back under the startup rule: before its timeout a hang there went
    unjudged, after it an honest rewrite caught mid-way failed at once as "no progress artifact".
    Here an emptied dir is no change: the stall counts from the last change of files with bytes."""
    tracker = LivenessTracker(startup_timeout_s=10.0, stale_progress_s=100.0, started_monotonic=0.0)
    assert tracker.observe(progress(10), 1.0) is None
    assert tracker.observe(NOTHING, 5.0) is None
    assert tracker.observe(NOTHING, 10.5) is None
    assert tracker.observe(NOTHING, 101.5) == Finding(
        KIND_STALE, "training progress did not change for 100.5s", Source.SIDECAR
    )


def test_last_progress_age() -> None:
    tracker = LivenessTracker(startup_timeout_s=10.0, stale_progress_s=5.0, started_monotonic=0.0)
    assert tracker.last_progress_age(3.0) is None
    tracker.observe(NOTHING, 1.0)
    assert tracker.last_progress_age(3.0) is None
    tracker.observe(progress(5), 2.0)
    assert tracker.last_progress_age(3.5) == 1.5
    tracker.observe(progress(5), 3.0)  # no change: age keeps growing from the change
    assert tracker.last_progress_age(4.0) == 2.0


def test_files_a_resumed_attempt_found_are_not_its_first_progress() -> None:
    """The attempts of a run share a progress dir: what the earlier ones left is the baseline, and
    the startup timeout runs until the files change."""
    left = progress(500, max_mtime=900.0)
    tracker = LivenessTracker(
        startup_timeout_s=10.0, stale_progress_s=100.0, started_monotonic=0.0, baseline=left
    )
    assert tracker.last_progress_age(5.0) is None and tracker.observe(left, 5.0) is None
    assert tracker.observe(left, 10.5) == Finding(
        KIND_STARTUP,
        "training produced no progress artifact within 10.0s",
        Source.SIDECAR,
    )
    resumed = LivenessTracker(
        startup_timeout_s=10.0, stale_progress_s=100.0, started_monotonic=0.0, baseline=left
    )
    assert resumed.observe(progress(520, max_mtime=905.0), 3.0) is None
    assert resumed.last_progress_age(4.0) == 1.0


def test_a_progress_dir_emptied_after_progress_began_is_judged_by_the_stale_rule() -> None:
    """Deleting the files (a hung trainer's trick, or an honest rewrite caught between truncate and
    write) neither escapes the stall nor brings back the startup rule with its false reason."""
    tracker = LivenessTracker(startup_timeout_s=600.0, stale_progress_s=5.0, started_monotonic=0.0)
    assert tracker.observe(progress(100), 1.0) is None
    assert tracker.observe(progress(0, file_count=0), 2.0) is None  # emptied: no change
    found = tracker.observe(progress(0, file_count=0), 6.5)
    assert found is not None and found.kind == KIND_STALE, found
    honest = LivenessTracker(startup_timeout_s=5.0, stale_progress_s=60.0, started_monotonic=0.0)
    assert honest.observe(progress(10), 1.0) is None
    assert honest.observe(progress(0), 6.0) is None  # truncated for a rewrite after the startup timeout
    assert honest.observe(progress(12), 6.5) is None
