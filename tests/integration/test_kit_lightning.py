"""The trainer kit's Lightning adapter on the real PyTorch Lightning (the trainer venv), under the
real CLI: the four-line adoption of tests/trainers/lightning_trainer.py passes, stops at the
checkpoint margin with Lightning's own checkpoint on disk, stops from outside and resumes from that
checkpoint on the next attempt, fails on a crash, and is a stall when a rank hangs. A user's script
(tests/trainers/lightning_user_trainer.py: validation, its own ModelCheckpoint and CheckpointIO,
gradient accumulation) gets each phase its own timeout, its saves recorded with the step they hold,
and two ranks stopping at one step, under torchrun and under Lightning's own launcher."""

from __future__ import annotations

import re
import signal
import subprocess
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


# The user's script: a train timeout shorter than its slow eval and save, the phases' own longer.
TRAIN_S, SLOW_S, PHASE_S = 6, 9, 14
TIMEOUTS = (
    "--stale-progress",
    str(TRAIN_S),
    "--stale-eval",
    str(PHASE_S),
    "--stale-checkpoint",
    str(PHASE_S),
)


@pytest.fixture
def user_script(tmp_path: Path) -> KitTrainer:
    python = require("trainer-venv")
    return KitTrainer(
        python, tmp_path, "lightning_user_trainer.py", "--root", "5d1e7a02-3c6b-4f88-9e41-7a2b0c9d8e13"
    )


def test_slow_eval_and_save_pass_and_the_record_follows_last_ckpt(user_script: KitTrainer) -> None:
    # Saves at steps 4 and 8 (each a top-k file, then last.ckpt again), the first write slow; one
    # validation in training (batch 10, step 5), slow.
    command = user_script.one_rank(
        "--max-steps", "8", "--save-every", "4", "--eval-s", str(SLOW_S), "--save-s", str(SLOW_S)
    )
    run = user_script.soak(command, *TIMEOUTS)
    assert run.code == 0, (run.artifact.get("failure_reason"), run.stderr)
    assert run.artifact["run_summary"]["steps"] == 8
    longest = {
        timeout["phase"]: timeout["longest_visit_s"]
        for timeout in run.artifact["resource_summary"]["progress"]["phase_timeouts"]
    }
    assert longest["eval"] > TRAIN_S and longest["checkpoint"] > TRAIN_S, longest
    record = user_script.record
    last = Path(record["path"])
    assert last.name == "last.ckpt" and record["step"] == 8 == _global_step(user_script.python, last)
    assert record["bytes"] == last.stat().st_size


@pytest.mark.parametrize(
    ("fault", "phase"),
    [
        (("--hang-in-eval",), "eval"),
        (("--save-every", "2", "--hang-in-save"), "checkpoint"),
        (("--save-every", "2", "--hang-in-step", "2"), None),  # right after a save: the train timeout
    ],
    ids=["eval", "save", "step-after-save"],
)
def test_a_hang_stalls_after_its_phases_timeout(
    user_script: KitTrainer, fault: tuple[str, ...], phase: str | None
) -> None:
    run = user_script.soak(user_script.one_rank("--max-steps", "100", *fault), *TIMEOUTS)
    assert run.code == 12, run.stderr
    reason = run.artifact["failure_reason"]
    if phase is None:
        idle = float(re.findall(r"did not change for ([0-9.]+)s", reason)[0])
        assert " in phase " not in reason and idle < PHASE_S, reason
        assert user_script.record["step"] == 2  # the save before the hang landed
    else:
        assert f"in phase {phase} (its stale timeout: {PHASE_S}s)" in reason, reason
    assert run.stack_has_line(user_script.script, "time.sleep(1)  # the hung"), run.artifact["stacks"]


@pytest.mark.parametrize("launcher", ["torchrun", "lightning"])
def test_two_ranks_stop_at_one_step_and_resume(user_script: KitTrainer, launcher: str) -> None:
    flags = ("--max-steps", "16", "--save-every", "4", "--step-s", "0.1")
    # Lightning's own launcher: rank 1 a child of rank 0, started by Lightning, not torchrun.
    command = (
        user_script.two_ranks(*flags)
        if launcher == "torchrun"
        else user_script.one_rank("--devices", "2", *flags)
    )
    first = user_script.start(command, "--budget", "900")
    user_script.wait_for_step(2)
    first.send_signal(signal.SIGTERM)
    stopped = user_script.finish(first)
    assert stopped.code == 17, stopped.stderr
    record = user_script.record
    step = record["step"]
    assert Path(record["path"]).name == f"soak-stop-step{step}.ckpt" and step < 16, record
    assert _ends(stopped.console) == {0: step, 1: step}, stopped.console[-3000:]
    resumed = user_script.soak(command, "--resume-checkpoint", str(user_script.progress / "checkpoint.json"))
    assert resumed.code == 0, resumed.stderr
    assert f"Restoring states from the checkpoint path at {record['path']}" in resumed.console
    assert _ends(resumed.console) == {0: 16, 1: 16}, resumed.console[-3000:]
    assert Path(user_script.record["path"]).name == "last.ckpt" and user_script.record["step"] == 16


def _ends(console: str) -> dict[int, int]:
    """The step each rank's fit ended at (the script prints it)."""
    return {int(rank): int(step) for rank, step in re.findall(r"rank (\d) ended at step (\d+)", console)}


def _global_step(python: Path, checkpoint: Path) -> int:
    """The step a Lightning checkpoint holds, read with the trainer venv's torch."""
    read = "import sys, torch; print(torch.load(sys.argv[1], weights_only=False)['global_step'])"
    out = subprocess.run(
        [str(python), "-c", read, str(checkpoint)], capture_output=True, text=True, check=True
    )
    return int(out.stdout)
