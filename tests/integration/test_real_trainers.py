"""Real launchers under the real stack: torchrun with two gloo ranks and DataLoader workers, and
OpenMPI's mpirun with two mpi4py ranks, supervised by `soak-sidecar run --local`.

The trainers (tests/trainers/) run under the trainer venv .ci/run builds (torch, mpi4py); the
launcher runs under that venv's Python too, as it would in a trainer image. Each test checks the
verdict and that no process of the run is left.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.components import require
from tests.fixtures import trainers

pytestmark = [pytest.mark.integration, pytest.mark.trainers]

REPO = Path(__file__).resolve().parents[2]
TRAINERS = trainers.TRAINERS_DIR


@pytest.fixture(scope="module")
def trainer_python() -> Path:
    return require("trainer-venv")


@dataclass(frozen=True)
class Soak:
    code: int
    artifact: dict[str, Any]
    stderr: str
    progress: Path

    @property
    def launcher_exit(self) -> dict[str, Any]:
        found: dict[str, Any] = self.artifact["post_shutdown"]["launcher_exit"]
        return found


def soak(tmp_path: Path, command: list[str], *flags: str) -> Soak:
    """`soak-sidecar run --local` of ``command`` with fast sampling; every process is gone after."""
    progress = tmp_path / "progress"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),  # the trainers reuse the example trainer's run_summary
        "SOAK_LAUNCHER__KILL_GRACE_S": "3",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }
    argv = [
        sys.executable, "-m", "sidecar.cli", "run", "--local",
        "--output", str(tmp_path / "out"), "--run-dir", str(tmp_path / "run"),
        "--progress-dir", str(progress), "--deadline-dir", str(tmp_path / "deadlines"),
        "--sample-interval", "0.5", "--post-shutdown-grace", "0.5", "--gpu-backend", "none",
        "--status", "off", "--startup-timeout", "120", *flags, "--", *command,
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    (path,) = (tmp_path / "out" / "runs").glob("*/*/artifact.json")
    result = Soak(done.returncode, json.loads(path.read_text(encoding="utf-8")), done.stderr, progress)
    processes = psutil.process_iter(["pid", "cmdline"])
    left = [p.info for p in processes if str(progress) in " ".join(p.info["cmdline"] or [])]
    assert not left, f"processes of the run outlived it: {left}"
    return result


def torchrun(python: Path, *args: str) -> list[str]:
    return [
        str(python), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(TRAINERS / "ddp_trainer.py"), "--step-s", "0.05", *args,
    ]  # fmt: skip


def mpirun(python: Path, *args: str) -> list[str]:
    program = shutil.which("mpirun")
    if program is None:
        pytest.fail("mpirun is not installed (.ci/run installs openmpi-bin)")
    # `python -m mpi4py`: an exception in one rank aborts the whole job (MPI_Abort) instead of
    # leaving the others waiting in a collective.
    script = str(TRAINERS / "mpi_trainer.py")
    return [program, "--oversubscribe", "-np", "2", str(python), "-m", "mpi4py", script, *args]


def checkpoints(progress: Path, suffix: str) -> list[str]:
    return sorted(path.name for path in progress.glob(f"ckpt-rank*{suffix}"))


# ---------------------------------------------------------------------- torchrun


def test_torchrun_ddp_with_dataloader_workers_passes(tmp_path: Path, trainer_python: Path) -> None:
    run = soak(tmp_path, torchrun(trainer_python, "--steps", "15"))
    assert run.code == 0, run.stderr
    # Two ranks, each with two DataLoader workers, all sampled as one tree under the launcher.
    assert run.artifact["resource_summary"]["max_process_count"] >= 7, run.artifact["resource_summary"]


def test_torchrun_soft_stop_reaches_every_rank_and_spares_the_agent(
    tmp_path: Path, trainer_python: Path
) -> None:
    command = torchrun(trainer_python, "--steps", "100000")
    run = soak(tmp_path, command, "--budget", "45", "--checkpoint-margin", "30")
    assert run.code == 14, run.stderr
    assert run.artifact["failure_classification"] == "deadline_exhausted"
    assert checkpoints(run.progress, ".pt") == ["ckpt-rank0.pt", "ckpt-rank1.pt"]
    exit_record = run.launcher_exit
    # torchrun itself was not killed by the soft stop: it exited 0 once its ranks had.
    assert (exit_record["returncode"], exit_record["signal"]) == (0, None), exit_record
    assert not exit_record["term_sent"] and not exit_record["kill_sent"]
    assert exit_record["trainer_pid"] not in exit_record["soft_stop_signalled"]
    assert len(exit_record["soft_stop_signalled"]) >= 2  # the ranks (and their DataLoader workers)


def test_torchrun_rank_hanging_in_a_collective_is_a_stall_with_both_ranks_stacks(
    tmp_path: Path, trainer_python: Path
) -> None:
    command = torchrun(trainer_python, "--steps", "100000", "--fault", "hang")
    run = soak(tmp_path, command, "--stale-progress", "8")
    assert run.code == 12, run.stderr
    assert run.artifact["failure_classification"] == "timeout/stale_tick"
    # py-spy through the launcher, before the TERM: rank 0 where it stopped, rank 1 in the collective.
    stacks = run.artifact["stacks"]
    assert stacks["tool"] and stacks["captured_unix"] <= run.launcher_exit["stop_times_unix"]["term"]
    taken = [p["stack"] for p in stacks["processes"] if p["stack"] and "ddp_trainer.py" in p["stack"]]
    stalled = [stack for stack in taken if "stall_before_the_collective" in stack]
    waiting = [stack for stack in taken if "agreed (" in stack and "all_reduce" in stack]
    assert len(stalled) == 1 and len(waiting) == 1, json.dumps(stacks, indent=1)[:4000]


def test_torchrun_rank_that_raises_is_the_trainers_failure(tmp_path: Path, trainer_python: Path) -> None:
    run = soak(tmp_path, torchrun(trainer_python, "--steps", "100000", "--fault", "raise"))
    assert run.code == 10, run.stderr
    assert run.artifact["failure_classification"] == "trainer_failure"
    assert run.artifact["failure_reason"].startswith("trainer exited with returncode 1")


def test_torchrun_worker_that_daemonizes_is_a_leak(tmp_path: Path, trainer_python: Path) -> None:
    run = soak(tmp_path, torchrun(trainer_python, "--steps", "15", "--fault", "daemon"))
    assert run.code == 13, run.stderr
    residuals = run.artifact["post_shutdown"]["residual_processes"]
    assert any("signal.SIG_IGN" in p["command"] for p in residuals), residuals
    assert all(not psutil.pid_exists(p["pid"]) for p in residuals)


# ---------------------------------------------------------------------- mpirun


def test_mpirun_passes(tmp_path: Path, trainer_python: Path) -> None:
    run = soak(tmp_path, mpirun(trainer_python, "--steps", "15"))
    assert run.code == 0, run.stderr


def test_mpirun_soft_stop_reaches_every_rank(tmp_path: Path, trainer_python: Path) -> None:
    command = mpirun(trainer_python, "--steps", "100000")
    run = soak(tmp_path, command, "--budget", "30", "--checkpoint-margin", "20")
    assert run.code == 14, run.stderr
    assert checkpoints(run.progress, ".json") == ["ckpt-rank0.json", "ckpt-rank1.json"]
    assert run.launcher_exit["returncode"] == 0 and not run.launcher_exit["kill_sent"]


def test_mpirun_rank_that_raises_is_the_trainers_failure(tmp_path: Path, trainer_python: Path) -> None:
    run = soak(tmp_path, mpirun(trainer_python, "--steps", "100000", "--fault", "raise"))
    assert run.code == 10, run.stderr
    assert run.artifact["failure_classification"] == "trainer_failure"


def test_mpirun_rank_hanging_in_a_collective_is_a_stall(tmp_path: Path, trainer_python: Path) -> None:
    command = mpirun(trainer_python, "--steps", "100000", "--fault", "hang")
    run = soak(tmp_path, command, "--stale-progress", "8")
    assert run.code == 12, run.stderr
