"""The trainer kit's Lightning adapter on the real PyTorch Lightning (the trainer venv), under the
real CLI: the four-line adoption of tests/trainers/lightning_trainer.py passes, stops at the
checkpoint margin with Lightning's own checkpoint on disk, stops from outside and resumes from that
checkpoint on the next attempt, fails on a crash, and is a stall when a rank hangs."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.components import require
from tests.fixtures.kit_runs import KitTrainer

pytestmark = [pytest.mark.integration, pytest.mark.trainers]


@pytest.fixture
def lightning(tmp_path: Path) -> KitTrainer:
    python = require("trainer-venv")
    return KitTrainer(
        python, tmp_path, "lightning_trainer.py", "--root", "3f0c2b8e-9a41-4d7e-8c55-1b2d3e4f5a60"
    )


def test_lightning_passes(lightning: KitTrainer) -> None:
    run = lightning.soak(lightning.one_rank("--max-steps", "20"))
    assert run.code == 0, run.stderr
    summary = run.artifact["run_summary"]
    assert summary["status"] == "completed" and summary["steps"] == 20
    assert summary["runtime_manifest"]["kit"]["name"] == "soak_sidecar_kit"


def test_lightning_stops_at_the_margin_on_two_ranks_with_its_checkpoint_on_disk(
    lightning: KitTrainer,
) -> None:
    run = lightning.soak(
        lightning.two_ranks("--max-steps", "100000"), "--budget", "75", "--checkpoint-margin", "35"
    )
    assert run.code == 14, run.stderr
    assert run.artifact["failure_classification"] == "deadline_exhausted"
    record = lightning.record
    saved = Path(record["path"])
    assert (
        saved.is_file()
        and saved.name.startswith("soak-stop-step")
        and record["bytes"] == saved.stat().st_size
    )
    assert run.shutdown["classification"] == "external_cancellation"
    assert run.artifact["phases"]["checkpoint"] is not None  # the sidecar saw the record land
    exit_record = run.artifact["post_shutdown"]["launcher_exit"]
    # Stopped by the soft stop, never killed. The ranks may act on the soft-stop file before the
    # launcher's signal reaches them; having acted, the kit ignores late copies, so the launcher
    # then finds no handler to signal: either path is the soft stop.
    assert exit_record["soft_stop_sent"] and not exit_record["kill_sent"] and not exit_record["term_sent"]


def test_lightning_stopped_from_outside_resumes_from_its_own_checkpoint(lightning: KitTrainer) -> None:
    command = lightning.one_rank("--max-steps", "60", "--step-s", "0.1")  # every attempt runs the same
    first = lightning.start(command, "--budget", "900")
    lightning.wait_for_step(5)
    first.send_signal(signal.SIGTERM)
    stopped = lightning.finish(first)
    assert stopped.code == 17, stopped.stderr
    record = lightning.record
    assert 5 <= record["step"] < 60, record
    resumed = lightning.soak(command, "--resume-checkpoint", str(lightning.progress / "checkpoint.json"))
    assert resumed.code == 0, resumed.stderr
    assert f"Restoring states from the checkpoint path at {record['path']}" in resumed.console
    assert resumed.artifact["run_summary"]["steps"] == 60
    assert resumed.artifact["deadline"]["resumed"] is True


def test_lightning_crash_is_the_trainers_failure(lightning: KitTrainer) -> None:
    run = lightning.soak(lightning.one_rank("--max-steps", "100", "--crash-at", "5"))
    assert run.code == 10, run.stderr
    assert run.shutdown["classification"] == "learner_failure"
    assert run.shutdown["exception"]["message"] == "crash requested at step 5"


def test_lightning_hang_on_two_ranks_is_a_stall_with_the_hung_line(lightning: KitTrainer) -> None:
    run = lightning.soak(
        lightning.two_ranks("--max-steps", "100000", "--hang-at", "5"), "--stale-progress", "10"
    )
    assert run.code == 12, run.stderr
    assert run.artifact["failure_classification"] == "timeout/stale_tick"
    assert run.stack_has_line(lightning.script, "time.sleep(1)  # the hung"), run.artifact["stacks"]
