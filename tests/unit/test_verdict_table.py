"""The table `soak-sidecar verdict` prints: an INDEX column only for a multi-pod soak, long reasons
clipped, absent values as '-'."""

from __future__ import annotations

from dataclasses import replace

from sidecar.commands.verdict import REASON_COLUMN, render_table
from sidecar.core.job_pods import AttemptRow

ROW = AttemptRow(
    attempt=1,
    pod="job-aaaaa",
    index=None,
    phase="Running",
    verdict=None,
    classification=None,
    exit_code=None,
    reason="still running",
    artifact=None,
    artifact_sha256=None,
    source=None,
    created=None,
)


def test_a_single_pod_soak_has_no_index_column() -> None:
    header, line = render_table([ROW]).splitlines()
    assert header.split() == [
        "ATTEMPT",
        "POD",
        "PHASE",
        "VERDICT",
        "CLASSIFICATION",
        "EXIT",
        "REASON",
        "ARTIFACT",
    ]
    assert line.split() == ["1", "job-aaaaa", "Running", "-", "-", "-", "still", "running", "-"]


def test_a_multi_pod_soak_shows_each_rows_index_and_clips_long_reasons() -> None:
    failed = replace(ROW, index=0, verdict="failed", exit_code=12, reason="x" * 100, artifact="s3://b/a")
    table = render_table([failed, replace(ROW, pod="job-bbbbb")]).splitlines()
    assert table[0].split()[0] == "INDEX"
    assert table[1].split() == [
        "0",
        "1",
        "job-aaaaa",
        "Running",
        "failed",
        "-",
        "12",
        "x" * 59 + "\u2026",
        "s3://b/a",
    ]
    assert len("x" * 59 + "\u2026") == REASON_COLUMN
    assert table[2].split()[:2] == ["-", "1"]


def test_the_rate_column_shows_each_attempts_steps_per_second_when_any_has_one() -> None:
    fast, slow = (
        replace(ROW, index=0, steps_per_s=10.0),
        replace(ROW, index=1, pod="job-bbbbb", steps_per_s=6.6667),
    )
    table = render_table([fast, slow, replace(ROW, index=1, pod="job-ccccc")]).splitlines()
    assert table[0].split()[:3] == ["INDEX", "STEPS/S", "ATTEMPT"]
    assert [line.split()[:3] for line in table[1:]] == [["0", "10", "1"], ["1", "6.67", "1"], ["1", "-", "1"]]
