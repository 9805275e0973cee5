"""The throughput rule through the real CLI: a trainer whose steps keep slowing down is stopped and
fails throughput_dropped (exit 21) under --max-throughput-drop; the same rule leaves a steady
trainer alone."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.exitcodes import ExitCode
from tests.fixtures.local_soak import local_soak

pytestmark = pytest.mark.integration

# Steps of 20 ms that grow by ``growth`` of their time a second (0: steady), for ``seconds``.
TRAINER = """
import json, os, sys, time
growth, seconds = float(sys.argv[1]), float(sys.argv[2])
path = os.path.join(os.environ["SOAK_PROGRESS_DIR"], "progress.jsonl")
began = time.monotonic()
step = 0
while time.monotonic() - began < seconds:
    time.sleep(0.02 * (1 + growth * (time.monotonic() - began)))
    step += 1
    with open(path, "a") as out:
        out.write(json.dumps({"step": step, "phase": "train"}) + "\\n")
"""


def soak(tmp: Path, growth: float, seconds: float) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    flags = ["--max-throughput-drop", "20"]
    return local_soak(
        tmp, TRAINER, [str(growth), str(seconds)], flags=flags, settings={"SOAK_MONITOR__STATUS_LINE": "off"}
    )


def test_a_trainer_slowing_down_past_the_limit_is_stopped_and_fails_throughput_dropped(
    tmp_path: Path,
) -> None:
    done, artifact = soak(tmp_path, growth=1.0, seconds=60)
    assert done.returncode == ExitCode.THROUGHPUT_DROPPED, done.stderr
    assert artifact["failure_classification"] == "throughput_dropped"
    assert "more than monitor.max_throughput_drop_pct 20 % an hour" in artifact["failure_reason"]
    progress = artifact["resource_summary"]["progress"]
    assert progress["drop_per_hour_pct"] > 20 and progress["step_time_trend"]["low_per_hour"] > 0
    assert artifact["duration_s"] < 30  # stopped long before the trainer's own end


def test_a_steady_trainer_passes_the_same_rule(tmp_path: Path) -> None:
    done, artifact = soak(tmp_path, growth=0.0, seconds=6)
    assert done.returncode == ExitCode.CONTRACT_VIOLATION, done.stderr
    # Only the run_summary this plain trainer does not write fails it.
    assert artifact["failure_classification"] == "missing_run_summary", artifact["failure_reason"]
    progress = artifact["resource_summary"]["progress"]
    assert progress["slowdown"] is None and progress["step"] > 50
