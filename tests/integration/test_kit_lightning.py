"""The trainer kit's Lightning adapter on the real PyTorch Lightning (the trainer venv), under the
real CLI: the four-line adoption of tests/trainers/lightning_trainer.py passes, stops at the
checkpoint margin with Lightning's own checkpoint on disk, stops from outside and resumes from that
checkpoint on the next attempt, fails on a crash, and is a stall when a rank hangs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.components import require
from tests.fixtures import trainers
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.trainers]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = trainers.TRAINERS_DIR / "lightning_trainer.py"
RUN_ID = "3f0c2b8e-9a41-4d7e-8c55-1b2d3e4f5a60"


@pytest.fixture(scope="module")
def python() -> Path:
    return require("trainer-venv")


@dataclass(frozen=True)
class Attempt:
    code: int
    artifact: dict[str, Any]
    stderr: str
    console: str


def start(tmp_path: Path, command: list[str], *flags: str) -> subprocess.Popen[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SOAK_")},
        "PYTHONPATH": str(REPO),
        # Lightning with mpi4py installed asks MPI whether it runs under it, and OpenMPI then starts
        # a daemon that would outlive the trainer (a leak): docs/trainers.md says so.
        "OMPI_MCA_ess_singleton_isolated": "1",
    }
    argv = [
        sys.executable, "-m", "sidecar.cli", "run", "--local", "--run-id", RUN_ID,
        "--output", str(tmp_path / "out"), "--summary-profile", "core",
        "--sample-interval", "0.5", "--post-shutdown-grace", "0.5", "--gpu-backend", "none",
        "--status", "off", "--startup-timeout", "120",
        "--checkpoint", str(tmp_path / "out" / "runs" / RUN_ID / "progress" / "checkpoint.json"),
        *flags, "--", *command,
    ]  # fmt: skip
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(tmp_path: Path, proc: subprocess.Popen[str]) -> Attempt:
    _, err = proc.communicate(timeout=400)
    attempts = sorted((tmp_path / "out" / "runs" / RUN_ID).glob("attempt-*"), key=lambda p: int(p.name[8:]))
    latest = attempts[-1]
    artifact = json.loads((latest / "artifact.json").read_text(encoding="utf-8"))
    console = (latest / "console.log").read_text(encoding="utf-8", errors="replace")
    left = [
        p.info
        for p in psutil.process_iter(["pid", "cmdline"])
        if str(tmp_path) in " ".join(p.info["cmdline"] or [])
    ]
    assert not left, f"processes of the run outlived it: {left}"
    return Attempt(proc.returncode, artifact, err, console)


def soak(tmp_path: Path, command: list[str], *flags: str) -> Attempt:
    return finish(tmp_path, start(tmp_path, command, *flags))


def one_rank(python: Path, tmp_path: Path, *args: str) -> list[str]:
    # The trainer's own output (its checkpoints) in the test's folder, named on its command line:
    # what the leftover check looks for.
    return [str(python), str(SCRIPT), "--root", str(tmp_path / "lightning-root"), *args]


def two_ranks(python: Path, tmp_path: Path, *args: str) -> list[str]:
    run = [str(python), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    return [*run, str(SCRIPT), "--root", str(tmp_path / "lightning-root"), *args]


def progress(tmp_path: Path) -> Path:
    return tmp_path / "out" / "runs" / RUN_ID / "progress"


def test_lightning_passes(tmp_path: Path, python: Path) -> None:
    run = soak(tmp_path, one_rank(python, tmp_path, "--max-steps", "20"))
    assert run.code == 0, run.stderr
    summary = run.artifact["run_summary"]
    assert summary["status"] == "completed" and summary["steps"] == 20
    assert summary["runtime_manifest"]["kit"]["name"] == "soak_sidecar_kit"


def test_lightning_stops_at_the_margin_on_two_ranks_with_its_checkpoint_on_disk(
    tmp_path: Path, python: Path
) -> None:
    run = soak(
        tmp_path,
        two_ranks(python, tmp_path, "--max-steps", "100000"),
        "--budget",
        "75",
        "--checkpoint-margin",
        "35",
    )
    assert run.code == 14, run.stderr
    assert run.artifact["failure_classification"] == "deadline_exhausted"
    record = json.loads((progress(tmp_path) / "checkpoint.json").read_text(encoding="utf-8"))
    saved = Path(record["path"])
    assert (
        saved.is_file()
        and saved.name.startswith("soak-stop-step")
        and record["bytes"] == saved.stat().st_size
    )
    shutdown = run.artifact["run_summary"]["runtime_manifest"]["shutdown"]
    assert shutdown["classification"] == "external_cancellation"
    assert run.artifact["phases"]["checkpoint"] is not None  # the sidecar saw the record land
    exit_record = run.artifact["post_shutdown"]["launcher_exit"]
    assert not exit_record["kill_sent"] and len(exit_record["soft_stop_signalled"]) >= 2


def test_lightning_stopped_from_outside_resumes_from_its_own_checkpoint(tmp_path: Path, python: Path) -> None:
    command = one_rank(
        python, tmp_path, "--max-steps", "60", "--step-s", "0.1"
    )  # every attempt runs the same
    first = start(tmp_path, command, "--budget", "900")
    lines = progress(tmp_path) / "progress.jsonl"

    def stepped() -> bool:
        return lines.exists() and any(
            json.loads(line)["step"] >= 5 for line in lines.read_text().splitlines()
        )

    wait_until("five steps of progress", stepped, 180)
    first.send_signal(signal.SIGTERM)
    stopped = finish(tmp_path, first)
    assert stopped.code == 17, stopped.stderr
    record = json.loads((progress(tmp_path) / "checkpoint.json").read_text(encoding="utf-8"))
    checkpoint = progress(tmp_path) / "checkpoint.json"
    assert 5 <= record["step"] < 60, record
    resumed = soak(tmp_path, command, "--resume-checkpoint", str(checkpoint))
    assert resumed.code == 0, resumed.stderr
    assert f"Restoring states from the checkpoint path at {record['path']}" in resumed.console
    assert resumed.artifact["run_summary"]["steps"] == 60
    assert resumed.artifact["deadline"]["resumed"] is True


def test_lightning_crash_is_the_trainers_failure(tmp_path: Path, python: Path) -> None:
    run = soak(tmp_path, one_rank(python, tmp_path, "--max-steps", "100", "--crash-at", "5"))
    assert run.code == 10, run.stderr
    shutdown = run.artifact["run_summary"]["runtime_manifest"]["shutdown"]
    assert shutdown["classification"] == "learner_failure"
    assert shutdown["exception"]["message"] == "crash requested at step 5"


def test_lightning_hang_on_two_ranks_is_a_stall_with_the_hung_line(tmp_path: Path, python: Path) -> None:
    run = soak(
        tmp_path,
        two_ranks(python, tmp_path, "--max-steps", "100000", "--hang-at", "5"),
        "--stale-progress",
        "10",
    )
    assert run.code == 12, run.stderr
    assert run.artifact["failure_classification"] == "timeout/stale_tick"
    lines = SCRIPT.read_text(encoding="utf-8").splitlines()
    hung = next(
        n for n, line in enumerate(lines, start=1) if line.strip().startswith("time.sleep(1)  # the hung")
    )
    stacks = [p["stack"] or "" for p in run.artifact["stacks"]["processes"]]
    assert any(f"lightning_trainer.py:{hung}" in stack for stack in stacks), json.dumps(stacks)[:4000]
