"""Earlier attempts' local directories as the next attempt reads them: only attempt directories,
never through a link, each record bounded and handed on one at a time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sidecar.adapters.attempt_history import MAX_ATTEMPT_PLACES, LocalAttemptHistory
from sidecar.core.artifact.lost import PROVISIONAL_LIMIT_BYTES, lost_attempts

pytestmark = pytest.mark.integration

RUN = "7c9e6679-7425-40de-944b-e07fc1f90ae7"


def provisional(directory: Path, attempt: int) -> None:
    directory.mkdir(parents=True)
    doc = {"status": "running", "context": {"run_id": RUN, "attempt": attempt}}
    (directory / "artifact.json").write_text(json.dumps(doc))


def test_only_attempt_directories_are_read(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    provisional(runs / RUN / "attempt-1", 1)
    provisional(runs / RUN / "index-0-attempt-2-pod-abc12", 2)
    provisional(runs / RUN / "planted", 3)  # not an attempt's name
    provisional(tmp_path / "elsewhere", 4)
    (runs / RUN / "attempt-4").symlink_to(tmp_path / "elsewhere")  # a link is never followed
    os.mkfifo(runs / RUN / "attempt-1" / "samples.jsonl.gz")
    (runs / RUN / "attempt-3" / "artifact.json").mkdir(parents=True)  # not a file: no record, no error
    found = list(LocalAttemptHistory(runs).find(RUN, ""))
    assert sorted(Path(f.location).parent.name for f in found) == ["attempt-1", "index-0-attempt-2-pod-abc12"]
    lost = lost_attempts(found, run_id=RUN, index=None, before=9)
    assert [each.attempt for each in lost] == [1, 2]


def test_a_final_artifact_is_not_read_whole_and_a_missing_run_is_no_attempt(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    (runs / RUN / "attempt-1").mkdir(parents=True)
    (runs / RUN / "attempt-1" / "artifact.json").write_bytes(b" " * (PROVISIONAL_LIMIT_BYTES * 3))
    (only,) = LocalAttemptHistory(runs).find(RUN, "")
    assert only.final and only.record is not None and len(only.record) == PROVISIONAL_LIMIT_BYTES + 1
    assert list(LocalAttemptHistory(runs).find("another", "")) == []


def test_at_most_so_many_places_are_looked_at(tmp_path: Path) -> None:
    runs = tmp_path / "runs" / RUN
    runs.mkdir(parents=True)
    for number in range(MAX_ATTEMPT_PLACES + 50):
        (runs / f"attempt-{number + 1}").mkdir()
    assert len(list(LocalAttemptHistory(tmp_path / "runs").find(RUN, ""))) == 0
    for number in range(MAX_ATTEMPT_PLACES + 50):
        (runs / f"attempt-{number + 1}" / "artifact.json").write_text("{}")
    assert len(list(LocalAttemptHistory(tmp_path / "runs").find(RUN, ""))) == MAX_ATTEMPT_PLACES
