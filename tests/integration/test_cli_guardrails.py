"""Runs that must stop early and clearly: a busy run dir, an unusable directory, a trainer that
cannot start, output that cannot be written, and local runs that must not see each other's files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sidecar.adapters.artifact_dir import SamplesFile
from sidecar.adapters.rundir.channel import RunDir

pytestmark = pytest.mark.integration

FAST = {
    "SOAK_MONITOR__SAMPLE_INTERVAL_S": "0.2",
    "SOAK_MONITOR__POST_SHUTDOWN_GRACE_S": "0.2",
    "SOAK_MONITOR__STATUS_LINE": "off",
}


def run_cli(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "run", "--local", *args],
        cwd=tmp,
        env={**os.environ, **FAST, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def artifacts(tmp: Path) -> list[dict[str, Any]]:
    found = sorted((tmp / "soak-output" / "runs").glob("*/*/artifact.json"))
    return [json.loads(path.read_text(encoding="utf-8")) for path in found]


def test_a_run_dir_in_use_by_another_sidecar_is_refused_untouched(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path / "shared-run")
    with run_dir.exclusive():
        (tmp_path / "shared-run" / "go.json").write_text("{}", encoding="utf-8")
        done = run_cli(tmp_path, "--run-dir", str(tmp_path / "shared-run"))
        assert done.returncode == 15, done.stderr
        assert "another soak-sidecar is using run dir" in done.stderr
        # the other sidecar's files were neither reset nor answered with an abort
        assert (tmp_path / "shared-run" / "go.json").exists()
        assert not (tmp_path / "shared-run" / "abort.json").exists()


def test_an_unusable_directory_is_a_usage_error_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    done = run_cli(tmp_path, "--progress-dir", str(tmp_path / "a-file" / "progress"))
    assert done.returncode == 64, done.stderr
    assert "cannot use directory" in done.stderr
    assert not (tmp_path / "soak-output" / "deadlines").exists()  # no budget was started


@pytest.mark.parametrize(
    ("program", "problem"),
    [("no-such-trainer-on-path", "was not found"), ("{tmp}/train.sh", "is not executable")],
    ids=["not on PATH", "not executable"],
)
def test_a_trainer_that_cannot_start_is_trainer_not_started(
    tmp_path: Path, program: str, problem: str
) -> None:
    (tmp_path / "train.sh").write_text("#!/bin/sh\n", encoding="utf-8")
    (tmp_path / "train.sh").chmod(0o644)
    command = [program.format(tmp=tmp_path)]
    done = run_cli(tmp_path, "--", *command)
    assert done.returncode == 19, done.stderr
    (artifact,) = artifacts(tmp_path)
    assert artifact["failure_classification"] == "trainer_not_started"
    assert f"{command[0]!r} {problem}" in artifact["failure_reason"]
    # Found by the launcher before the go-ahead: no deadline record, no attempt number used.
    assert not list((tmp_path / "soak-output" / "deadlines").glob("*.json"))
    assert artifact["context"]["attempt"] == 0


def test_an_unknown_soft_stop_signal_is_refused_before_any_record(tmp_path: Path) -> None:
    done = run_cli(tmp_path, SOAK_LAUNCHER__SOFT_STOP_SIGNAL="SIGFOO")
    assert done.returncode == 64
    assert "unknown signal 'SIGFOO'" in done.stderr
    assert not (tmp_path / "soak-output" / "deadlines").exists()


def test_local_runs_do_not_see_each_others_progress(tmp_path: Path) -> None:
    trainer = [sys.executable, "-m", "sidecar.examples.trainer", "--steps", "3", "--step-s", "0.1"]
    first = run_cli(tmp_path, "--", *trainer)
    assert first.returncode == 0, first.stderr
    # The second trainer writes no run_summary.json: the first run's must not count for it.
    second = run_cli(tmp_path, "--", *trainer, "--no-summary")
    assert second.returncode == 11, second.stderr
    assert sorted(a["exit_code"] for a in artifacts(tmp_path)) == [0, 11]


def test_stale_progress_is_caught_between_samples(tmp_path: Path) -> None:
    done = run_cli(
        tmp_path,
        "--sample-interval",
        "30",
        "--stale-progress",
        "1",
        "--",
        *(sys.executable, "-m", "sidecar.examples.trainer", "--hang"),
    )
    assert done.returncode == 12, done.stderr
    (artifact,) = artifacts(tmp_path)
    assert artifact["failure_classification"] == "timeout/stale_tick"
    # judged on the liveness cadence (a tenth of the timeout), not the 30 s sample interval
    idle = float(artifact["failure_reason"].split("did not change for ")[1].split("s")[0])
    assert idle < 10


def test_a_full_disk_under_the_samples_file_is_recorded_not_raised() -> None:
    samples = SamplesFile(Path("/dev/full"))
    for _ in range(2000):
        samples.write_line('{"sample": "' + "x" * 200 + '"}')
    samples.close()
    assert samples.error is not None and "No space left on device" in samples.error


def test_a_bundled_gpu_scenario_by_name_from_any_directory(tmp_path: Path) -> None:
    done = run_cli(tmp_path, "--gpu-backend", "mock", "--gpu-scenario", "two_gpus_growing")
    assert done.returncode == 0, done.stderr
    (artifact,) = artifacts(tmp_path)
    assert len(artifact["resource_summary"]["gpu_devices"]) == 2


def test_an_artifact_that_cannot_be_written_is_said_so_and_loses_the_pass(tmp_path: Path) -> None:
    run_id = "6d1f3a52-2f0e-4c59-9d3e-2b1f0c1d2e3f"
    # While the trainer runs, a directory takes the place of the provisional artifact.json: the
    # final write fails after a passing soak.
    artifact = f"soak-output/runs/{run_id}/attempt-1/artifact.json"
    trainer = (
        f"rm {artifact} && mkdir {artifact} && exec {sys.executable} -m sidecar.examples.trainer --steps 4"
    )
    done = run_cli(tmp_path, "--run-id", run_id, "--", "sh", "-c", trainer)
    assert done.returncode == 16, done.stderr
    assert "the local artifact was not written" in done.stderr
    assert done.stderr.rstrip().endswith("artifact not written (the reason is above) (exit code 16)")


def test_an_artifact_that_cannot_be_written_at_the_start_is_a_usage_error_before_the_trainer_starts(
    tmp_path: Path,
) -> None:
    """The provisional artifact is written before the go-ahead: a directory where artifact.json
    must go stops the run there, with no compute spent."""
    run_id = "6d1f3a52-2f0e-4c59-9d3e-2b1f0c1d2e3f"
    runs = tmp_path / "soak-output" / "runs" / run_id
    (runs / "attempt-1" / "artifact.json").mkdir(parents=True)
    done = run_cli(tmp_path, "--run-id", run_id)
    assert done.returncode == 64, done.stderr
    assert "cannot write the provisional artifact" in done.stderr
    assert "earlier attempts not all checked" not in done.stderr
    assert not list(runs.glob("progress/*"))  # the trainer never started


def test_an_unusable_artifact_directory_is_a_usage_error_before_the_trainer_starts(tmp_path: Path) -> None:
    run_id = "6d1f3a52-2f0e-4c59-9d3e-2b1f0c1d2e3f"
    runs = tmp_path / "soak-output" / "runs" / run_id
    runs.mkdir(parents=True)
    (runs / "attempt-1").write_text("", encoding="utf-8")  # a file where the directory must go
    done = run_cli(tmp_path, "--run-id", run_id)
    assert done.returncode == 64, done.stderr
    assert "cannot use artifact directory" in done.stderr
    assert not list(runs.glob("progress/*"))  # the trainer never started


def test_deleting_the_deadline_record_grants_no_fresh_budget(tmp_path: Path) -> None:
    run_id = "6d1f3a52-2f0e-4c59-9d3e-2b1f0c1d2e3f"
    assert run_cli(tmp_path, "--run-id", run_id).returncode == 0
    (tmp_path / "soak-output" / "deadlines" / f"{run_id}.json").unlink()
    again = run_cli(tmp_path, "--run-id", run_id)
    assert again.returncode == 15, again.stderr
    assert "record is missing" in again.stderr and "refusing a fresh budget" in again.stderr
    assert not (tmp_path / "soak-output" / "deadlines" / f"{run_id}.json").exists()
