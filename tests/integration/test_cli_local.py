"""The ``soak-sidecar`` command line, run as a real process (local mode, no Kubernetes)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from sidecar.adapters.rundir.zipapp import launcher_path
from sidecar.core.exitcodes import ExitCode
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "run_summary"
FAST = ["--sample-interval", "0.2", "--post-shutdown-grace", "0.2", "--gpu-backend", "none"]


def cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the installed console script (``python -m sidecar.cli`` when it is not on PATH)."""
    script = shutil.which("soak-sidecar")
    argv = [script] if script else [PY, "-m", "sidecar.cli"]
    # Only our own settings: SOAK_* from the caller's environment must not leak in.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SOAK_")}
    return subprocess.run(
        [*argv, *args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def trainer_cmd() -> list[str]:
    """The example trainer, writing where $SOAK_PROGRESS_DIR (set by the launcher) says."""
    return [*(PY, "-m", "sidecar.examples.trainer"), *("--steps", "3", "--step-s", "0.1")]


def test_run_local_embedded_default_passes(tmp_path: Path) -> None:
    done = cli("run", "--local", "--status", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "soak-sidecar: PASSED" in done.stderr
    artifacts = list((tmp_path / "soak-output" / "runs").glob("*/attempt-1/artifact.json"))
    assert len(artifacts) == 1
    artifact = json.loads(artifacts[0].read_text(encoding="utf-8"))
    assert artifact["status"] == "passed"
    assert artifact["exit_code"] == 0
    # --status json: one JSON object per sample on stderr
    status_lines = [line for line in done.stderr.splitlines() if line.startswith('{"event": "sample"')]
    assert status_lines
    assert all(json.loads(line)["event"] == "sample" for line in status_lines)


def test_help_texts(tmp_path: Path) -> None:
    top = cli("--help", cwd=tmp_path)
    assert top.returncode == 0
    for command in ("run", "validate", "schema", "exit-codes", "install-launcher", "approve", "verdict"):
        assert command in top.stdout
    assert "soak-sidecar run --local" in top.stdout
    run = cli("run", "--help", cwd=tmp_path)
    assert run.returncode == 0
    for flag in ("--local", "--pod", "--budget", "--checkpoint-margin", "--stale-progress", "--approval"):
        assert flag in run.stdout
    assert "SOAK_MONITOR__SAMPLE_INTERVAL_S" in run.stdout
    for command in ("validate", "schema", "exit-codes", "install-launcher", "approve"):
        sub = cli(command, "--help", cwd=tmp_path)
        assert sub.returncode == 0, (command, sub.stderr)
        assert sub.stdout.startswith("usage: soak-sidecar " + command)


def test_validate_valid_and_invalid(tmp_path: Path) -> None:
    valid = cli("validate", str(DATA / "minimal_completed.json"), cwd=tmp_path)
    assert valid.returncode == 0, valid.stdout + valid.stderr
    assert valid.stdout.strip().endswith(": valid")

    abnormal = cli("validate", str(DATA / "minimal_abnormal.json"), cwd=tmp_path)
    assert abnormal.returncode == 11
    assert "INVALID (learner_failure)" in abnormal.stdout

    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    as_json = cli("validate", "--json", str(broken), cwd=tmp_path)
    assert as_json.returncode == 11
    report = json.loads(as_json.stdout)
    assert report["valid"] is False
    assert report["classification"] == "invalid_run_summary"

    missing = cli("validate", str(tmp_path / "absent.json"), cwd=tmp_path)
    assert missing.returncode == 64  # a usage error: there is nothing to validate
    assert "No such file" in missing.stderr


@pytest.mark.parametrize("which", ["run-summary", "artifact", "settings"])
def test_schema_is_json(tmp_path: Path, which: str) -> None:
    done = cli("schema", which, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    schema = json.loads(done.stdout)
    assert isinstance(schema, dict)
    assert schema.get("type") == "object" or "properties" in schema or "$defs" in schema


def test_exit_codes_json(tmp_path: Path) -> None:
    done = cli("exit-codes", "--json", cwd=tmp_path)
    assert done.returncode == 0
    rows = {row["code"]: row for row in json.loads(done.stdout)}
    assert rows[0]["name"] == "PASSED"
    assert rows[0]["classifications"] == []
    assert "deadline_exhausted" in rows[14]["classifications"]
    assert "external_cancellation" in rows[17]["classifications"]
    assert rows[64]["name"] == "USAGE"
    assert all(row["retryable"] == (code >= 128) for code, row in rows.items())
    table = cli("exit-codes", cwd=tmp_path)
    assert table.returncode == 0
    assert table.stdout.startswith("| code | name | retryable |")


def test_install_launcher(tmp_path: Path) -> None:
    dest = tmp_path / "soak" / "bin"
    done = cli("install-launcher", "--dest", str(dest), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    installed = dest / "soak-launcher.py"
    assert installed.read_bytes() == launcher_path().read_bytes()
    assert os.access(installed, os.X_OK)
    # stdlib only: it runs under a bare interpreter without the package on the path
    usage = subprocess.run(
        [PY, "-I", str(installed), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert usage.returncode == 0
    assert "--run-dir" in usage.stdout
    # py-spy beside it, where the launcher looks first for a stall's stacks; it runs.
    reader = dest / "py-spy"
    assert os.access(reader, os.X_OK) and f"py-spy installed at {reader}" in done.stdout
    version = subprocess.run(
        [str(reader), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert version.stdout.startswith("py-spy ")


def test_approve_then_run_with_approval(tmp_path: Path) -> None:
    run_id = str(uuid.uuid4())
    command = trainer_cmd()
    common = ["--run-id", run_id, "--deadline-dir", str(tmp_path / "deadlines"), "--budget", "600"]
    approved = cli("approve", *common, "--", *command, cwd=tmp_path)
    assert approved.returncode == 0, approved.stderr
    approval = tmp_path / "approval.json"
    approval.write_text(approved.stdout, encoding="utf-8")
    assert json.loads(approved.stdout)["run_id"] == run_id

    ok = cli("run", "--local", *common, *FAST, "--approval", str(approval), "--", *command, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "soak-sidecar: PASSED" in ok.stderr


def test_mismatching_approval_is_refused(tmp_path: Path) -> None:
    run_id = str(uuid.uuid4())
    command = trainer_cmd()
    common = ["--run-id", run_id, "--deadline-dir", str(tmp_path / "deadlines")]
    approved = cli("approve", *common, "--budget", "600", "--", *command, cwd=tmp_path)
    assert approved.returncode == 0, approved.stderr
    approval = tmp_path / "approval.json"
    approval.write_text(approved.stdout, encoding="utf-8")

    # the same command with another budget is another identity
    refused = cli(
        "run",
        "--local",
        *common,
        "--budget",
        "900",
        *FAST,
        "--approval",
        str(approval),
        "--",
        *command,
        cwd=tmp_path,
    )
    assert refused.returncode == 15, refused.stderr
    assert "FAILED [refused]" in refused.stderr
    assert not (tmp_path / "soak-output" / "progress" / "progress.jsonl").exists()


def test_bad_settings_one_clear_line(tmp_path: Path) -> None:
    done = cli("run", "--local", cwd=tmp_path, env={"SOAK_MONITOR__SAMPLE_INTERVAL_S": "-1"})
    assert done.returncode == 64
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    # Named as the user set it: the environment variable.
    assert lines[0].startswith("soak-sidecar: error: invalid settings: SOAK_MONITOR__SAMPLE_INTERVAL_S")
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "soak-output" / "runs").exists()


BAD_PATTERNS = {"not JSON": "[", "broken JSON": '["a"', "not a list": '"[a-z]+"', "bad regex": '["["]'}
SETTINGS_COMMANDS = {
    "run": ["run", "--local"],
    "report": ["report", "soak-output"],
    "validate": ["validate", "run_summary.json"],
    "approve": ["approve", "--", "true"],
}


@pytest.mark.parametrize("value", BAD_PATTERNS.values(), ids=BAD_PATTERNS.keys())
@pytest.mark.parametrize("command", SETTINGS_COMMANDS.values(), ids=SETTINGS_COMMANDS.keys())
def test_a_bad_redaction_pattern_is_one_clear_line(tmp_path: Path, value: str, command: list[str]) -> None:
    done = cli(*command, cwd=tmp_path, env={"SOAK_REDACTION__EXTRA_PATTERNS": value})
    assert done.returncode == 64, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert done.stderr.startswith("soak-sidecar: error: invalid settings: ")
    assert "SOAK_REDACTION__EXTRA_PATTERNS" in done.stderr or "redaction" in done.stderr
    assert not (tmp_path / "soak-output").exists()


def test_a_deadline_dir_that_can_never_exist_is_a_usage_error(tmp_path: Path) -> None:
    # mkdir -p under /proc fails with ENOENT: configuration, not a store to retry (151).
    done = cli("run", "--local", "--deadline-dir", "/proc/soak-no-such-dir", *FAST, cwd=tmp_path)
    assert done.returncode == 64, done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        "soak-sidecar: error: cannot create deadline store /proc/soak-no-such-dir"
    ), done.stderr


def test_a_bad_gpu_scenario_is_one_line(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.json"
    scenario.write_text('{"gpus": [{"bad": 1}]}', encoding="utf-8")
    done = cli(
        "run", "--local", *FAST[:4], "--gpu-backend", "mock", "--gpu-scenario", str(scenario), cwd=tmp_path
    )
    assert done.returncode == 64, done.stderr
    assert "errors.pydantic.dev" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"soak-sidecar: error: NVML mock scenario {scenario}: gpus: Extra inputs are not permitted"
    ), done.stderr


@pytest.mark.parametrize("argv", [["schema", "artifact"], ["exit-codes", "--json"], ["schema", "settings"]])
def test_a_closed_stdout_ends_quietly(argv: list[str], tmp_path: Path) -> None:
    # `| head -1` without the race: the reader is gone before the first write.
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run(
            [PY, "-m", "sidecar.cli", *argv], cwd=tmp_path, stdout=writer, stderr=subprocess.PIPE, text=True,
            timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(writer)
    assert (done.returncode, done.stderr) == (141, "")


def test_run_id_alone_resumes_with_the_records_budget_and_a_different_one_is_refused(tmp_path: Path) -> None:
    run_id = str(uuid.uuid4())
    first = cli("run", "--local", *FAST, "--run-id", run_id, "--budget", "300", "--checkpoint-margin", "20",
                "--", *trainer_cmd(), cwd=tmp_path)  # fmt: skip
    assert first.returncode == 0, first.stderr
    again = cli("run", "--local", *FAST, "--run-id", run_id, "--", *trainer_cmd(), cwd=tmp_path)
    assert again.returncode == 0, again.stderr  # budget and margin from the record
    (attempt,) = (tmp_path / "soak-output" / "runs" / run_id).glob("attempt-2/artifact.json")
    assert json.loads(attempt.read_text())["deadline"]["budget_s"] == 300.0
    other = cli(
        "run", "--local", *FAST, "--run-id", run_id, "--budget", "400", "--", *trainer_cmd(), cwd=tmp_path
    )
    assert other.returncode == ExitCode.REFUSED and "budget_s: record 300.0, now 400.0" in other.stderr


def test_a_missing_approval_says_what_to_do(tmp_path: Path) -> None:
    done = cli("run", "--local", *FAST, "--require-approval", "--", *trainer_cmd(), cwd=tmp_path)
    assert done.returncode == ExitCode.REFUSED, done.stderr
    assert "missing review release" not in done.stderr
    assert (
        "FAILED [refused] this run needs an approval (--require-approval) and none was given: make one "
        "with `soak-sidecar approve` and the same run id, flags and command, review it, and pass it "
        "with --approval FILE"
    ) in done.stderr, done.stderr


def test_a_resume_without_a_declared_checkpoint_says_what_to_do(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint.json"
    checkpoint.write_text('{"step": 2}', encoding="utf-8")
    done = cli(
        "run", "--local", *FAST, "--resume-checkpoint", "checkpoint.json", "--", *trainer_cmd(), cwd=tmp_path
    )
    assert done.returncode == ExitCode.REFUSED, done.stderr
    assert "approved checkpoint is None" not in done.stderr
    assert (
        f"cannot resume from {checkpoint}: this run declares no checkpoint. Give every attempt (and "
        f"`soak-sidecar approve`) --checkpoint {checkpoint}, so the checkpoint is part of the run's "
        "identity, then resume with --resume-checkpoint"
    ) in done.stderr, done.stderr


def test_auto_resume_picks_up_the_runs_checkpoint_on_the_next_attempt_with_no_hand_step(
    tmp_path: Path,
) -> None:
    """A record kept outside the attempt (a pod's checkpoint volume): the first attempt starts afresh,
    is stopped and checkpoints there; the same command again resumes from it by itself."""
    run_id = str(uuid.uuid4())
    volume = tmp_path / "volume" / run_id
    flags = [*FAST, "--run-id", run_id, "--checkpoint", str(volume / "checkpoint.json"), "--auto-resume"]
    command = [PY, "-m", "sidecar.examples.trainer", "--steps", "30", "--step-s", "0.1"]
    script = shutil.which("soak-sidecar")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SOAK_")}
    first = subprocess.Popen(
        [*([script] if script else [PY, "-m", "sidecar.cli"]), "run", "--local", *flags, "--", *command],
        cwd=tmp_path, env=clean, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines = tmp_path / "soak-output" / "runs" / run_id / "progress" / "progress.jsonl"
    try:
        wait_until("three steps", lambda: lines.exists() and len(lines.read_text().splitlines()) >= 3, 60)
        first.send_signal(signal.SIGTERM)
    finally:
        _, err = first.communicate(timeout=60)
    assert first.returncode == ExitCode.CANCELLED, err
    assert f"to go on with this run, give the next attempt --run-id {run_id}" in err, err
    step = json.loads((volume / "checkpoint.json").read_text(encoding="utf-8"))["step"]
    # The same command under a new run id would resume another run's checkpoint on a fresh budget.
    elsewhere = cli(
        "run", "--local", *[f for f in flags if f not in ("--run-id", run_id)], "--", *command, cwd=tmp_path
    )
    assert elsewhere.returncode == ExitCode.REFUSED, elsewhere.stderr
    assert "takes its run's --run-id" in elsewhere.stderr, elsewhere.stderr
    second = cli("run", "--local", *flags, "--", *command, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    attempt = tmp_path / "soak-output" / "runs" / run_id / "attempt-2"
    console = (attempt / "console.log").read_text(encoding="utf-8")
    assert f"resumed from {volume / 'checkpoint.json'} at step {step}" in console, console
    deadline = json.loads((attempt / "artifact.json").read_text(encoding="utf-8"))["deadline"]
    assert deadline["resumed_from"] == str(volume / "checkpoint.json")


def test_an_unknown_gpu_scenario_is_one_line_before_anything_of_the_run_exists(tmp_path: Path) -> None:
    done = cli("run", "--local", "--gpu-scenario", "nosuch", "--", *trainer_cmd(), cwd=tmp_path)
    assert done.returncode == ExitCode.USAGE, done.stderr
    (line,) = done.stderr.splitlines()
    assert "NVML mock scenario nosuch" in line and "bundled scenarios: two_gpus_growing" in line
    assert not (tmp_path / "soak-output").exists()  # no deadline record, no attempt


def test_auto_resume_without_a_checkpoint_is_a_usage_error(tmp_path: Path) -> None:
    done = cli("run", "--local", *FAST, "--auto-resume", "--", *trainer_cmd(), cwd=tmp_path)
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert "--auto-resume needs deadline.checkpoint_path (--checkpoint)" in done.stderr, done.stderr


def test_an_approval_made_in_another_directory_releases_the_run(tmp_path: Path) -> None:
    """approve in A and run in B name one store, each by a path relative to its own directory."""
    here, there = tmp_path / "a", tmp_path / "b"
    here.mkdir()
    there.mkdir()
    run_id = str(uuid.uuid4())
    command = trainer_cmd()
    approved = cli("approve", "--run-id", run_id, "--output", "../b/out", "--", *command, cwd=here)
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["deadline_store"] == str((there / "out" / "deadlines").resolve())
    (here / "approval.json").write_text(approved.stdout, encoding="utf-8")
    ok = cli(
        "run", "--local", *FAST, "--run-id", run_id, "--output", "out", "--approval", "../a/approval.json",
        "--", *command, cwd=there,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    # and the other way round: the store named by --deadline-dir from yet another directory
    again = cli(
        "run", "--local", *FAST, "--run-id", run_id, "--deadline-dir", "b/out/deadlines", "--output", "b/out",
        "--approval", "a/approval.json", "--", *command, cwd=tmp_path,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr


def test_an_approval_for_another_store_names_both(tmp_path: Path) -> None:
    run_id = str(uuid.uuid4())
    approved = cli("approve", "--run-id", run_id, "--", *trainer_cmd(), cwd=tmp_path)
    (tmp_path / "approval.json").write_text(approved.stdout, encoding="utf-8")
    refused = cli(
        "run", "--local", *FAST, "--run-id", run_id, "--output", "elsewhere", "--approval", "approval.json",
        "--", *trainer_cmd(), cwd=tmp_path,
    )  # fmt: skip
    assert refused.returncode == ExitCode.REFUSED, refused.stderr
    assert (
        f"it names the deadline store '{tmp_path.resolve() / 'soak-output' / 'deadlines'}', this run uses "
        f"'{tmp_path.resolve() / 'elsewhere' / 'deadlines'}': give approve the same --deadline-dir or "
        "--output as run"
    ) in refused.stderr, refused.stderr


def test_approve_binds_the_s3_store_when_the_run_uses_it(tmp_path: Path) -> None:
    env = {"SOAK_DEADLINE__STORE": "s3", "SOAK_S3__BUCKET": "soaks", "SOAK_S3__DEADLINE_PREFIX": "soaks/dl"}
    approved = cli("approve", "--run-id", str(uuid.uuid4()), "--", "true", cwd=tmp_path, env=env)
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["deadline_store"] == "s3://soaks/soaks/dl/"


def test_a_report_of_a_refused_run_shows_its_verdict(tmp_path: Path) -> None:
    run_id = str(uuid.uuid4())
    refused = cli("run", "--local", *FAST, "--run-id", run_id, "--require-approval", cwd=tmp_path)
    assert refused.returncode == ExitCode.REFUSED, refused.stderr
    (attempt,) = (tmp_path / "soak-output" / "runs" / run_id).glob("unnumbered-*")
    done = cli("report", str(attempt), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    page = (attempt / "report.html").read_text(encoding="utf-8")
    assert "this run needs an approval (--require-approval) and none was given" in page
    assert "no samples: the trainer never ran in this attempt" in page
