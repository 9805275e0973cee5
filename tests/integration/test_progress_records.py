"""Structured progress through the real CLI: a checkpoint phase longer than the train timeout is no
stall, a hang inside it is one within the phase's own timeout (or, calibrated, within 3x the
longest checkpoint seen), and the finish is estimated from the declared total (the status's JSON
lines, the artifact)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.exitcodes import ExitCode
from tests.fixtures.local_soak import local_soak

pytestmark = pytest.mark.integration

TRAINER = """
import json, os, sys, time
path = os.path.join(os.environ["SOAK_PROGRESS_DIR"], "progress.jsonl")
def record(step, phase="train"):
    with open(path, "a") as out:
        out.write(json.dumps({"step": step, "phase": phase, "total_steps": 40}) + "\\n")
for step in range(1, 6):
    record(step)
    time.sleep(0.2)
record(5, "checkpoint")
time.sleep(float(sys.argv[1]))  # the checkpoint's save: no record meanwhile
if sys.argv[2] == "hang":
    time.sleep(3600)
record(6)
if sys.argv[2] == "hang-in-the-second":
    for step in range(7, 10):
        record(step)
        time.sleep(0.2)
    record(9, "checkpoint")
    time.sleep(3600)
"""


def soak(
    tmp: Path, checkpoint_s: float, how: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    settings = {"SOAK_MONITOR__STALE_PROGRESS_S": "1.5", "SOAK_MONITOR__STATUS_LINE": "json", **env}
    return local_soak(tmp, TRAINER, [str(checkpoint_s), how], settings=settings)


def test_a_checkpoint_longer_than_the_train_timeout_is_not_a_stall(tmp_path: Path) -> None:
    done, artifact = soak(tmp_path, 7.0, "finish", SOAK_MONITOR__STALE_CHECKPOINT_S="30")
    # No stall: the only failure is the run_summary this plain trainer does not write.
    assert artifact["failure_classification"] == "missing_run_summary", artifact["failure_reason"]
    progress = artifact["resource_summary"]["progress"]
    assert (progress["step"], progress["total_steps"], progress["records_refused"]) == (6, 40, 0)
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith('{"event": "sample"')]
    assert any(line["phase"] == "checkpoint" for line in lines)
    assert any(line["eta_s"] is not None and line["total_steps"] == 40 for line in lines)


def test_a_hang_inside_the_checkpoint_is_a_stall_within_the_phases_own_timeout(tmp_path: Path) -> None:
    began = time.monotonic()
    done, artifact = soak(tmp_path, 0.0, "hang", SOAK_MONITOR__STALE_CHECKPOINT_S="3")
    assert done.returncode == ExitCode.STALLED, done.stderr
    assert artifact["failure_classification"] == "timeout/stale_tick"
    assert "in phase checkpoint (its stale timeout: 3s)" in artifact["failure_reason"]
    assert time.monotonic() - began < 60


def test_a_hang_in_the_second_checkpoint_stalls_within_3x_the_first(tmp_path: Path) -> None:
    """A 1 s first checkpoint under factor 3: the second, hung, stalls after about 3 s, not 60."""
    began = time.monotonic()
    done, artifact = soak(
        tmp_path,
        1.0,
        "hang-in-the-second",
        SOAK_MONITOR__STALE_CHECKPOINT_S="60",
        SOAK_MONITOR__PHASE_CALIBRATION_FACTOR="3",
    )
    assert done.returncode == ExitCode.STALLED, done.stderr
    assert "in phase checkpoint (its stale timeout: " in artifact["failure_reason"]
    assert ", calibrated: 3x the longest seen, " in artifact["failure_reason"]
    assert time.monotonic() - began < 50
    progress = artifact["resource_summary"]["progress"]
    assert progress["phase_calibration_factor"] == 3
    (checkpoint,) = [found for found in progress["phase_timeouts"] if found["phase"] == "checkpoint"]
    assert checkpoint["configured_s"] == 60
    # Timed by samples (their first sight of each phase): up to a sample interval short of the 1 s.
    assert 0.5 <= checkpoint["longest_visit_s"] < 3.0
    assert checkpoint["calibrated_s"] == pytest.approx(3 * checkpoint["longest_visit_s"], abs=0.01)
