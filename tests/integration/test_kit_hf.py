"""The trainer kit's Hugging Face adapter on the real transformers Trainer (the trainer venv), under
the real CLI: the user-style script tests/trainers/hf_trainer.py (periodic evaluations and saves)
passes with an evaluation and a save each longer than the train timeout, stalls after that phase's
own timeout when one hangs and after the train timeout when training hangs right after a save,
stops at the checkpoint margin on two ranks with the Trainer's own checkpoint on disk, stops from
outside and resumes from that checkpoint on the next attempt, fails on a crash, and is a stall when
a rank hangs."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from tests.components import require
from tests.fixtures.kit_runs import KitTrainer

pytestmark = [pytest.mark.integration, pytest.mark.trainers]


@pytest.fixture
def hf(tmp_path: Path) -> KitTrainer:
    python = require("trainer-venv")
    return KitTrainer(
        python, tmp_path, "hf_trainer.py", "--output-dir", "7a1d9e42-3b5c-4f60-9d18-2c4e6f8a0b13"
    )


# A train timeout shorter than one slow evaluation or save, each phase's own longer than both.
TIMEOUTS = ("--stale-progress", "15", "--stale-eval", "35", "--stale-checkpoint", "35")


def test_hf_trainer_passes_with_an_eval_and_a_save_longer_than_the_train_timeout(hf: KitTrainer) -> None:
    command = hf.one_rank("--max-steps", "20", "--every", "8", "--eval-s", "18", "--save-s", "18")
    run = hf.soak(command, *TIMEOUTS)
    assert run.code == 0, run.stderr
    summary = run.artifact["run_summary"]
    assert summary["status"] == "completed" and summary["steps"] == 20
    assert summary["runtime_manifest"]["kit"]["name"] == "soak_sidecar_kit"
    progress = run.artifact["resource_summary"]["progress"]
    longest = {each["phase"]: each["longest_visit_s"] for each in progress["phase_timeouts"]}
    assert longest["eval"] > 15 and longest["checkpoint"] > 15, longest
    assert progress["total_steps"] == 20 and progress["eta_s"] == 0  # the save's record keeps them
    # Each evaluation in eval, each save in checkpoint, training again at once after: the phase
    # changes, at the steps the Trainer evaluated and saved at (8, 16 and the last, 20).
    changes: list[tuple[int, str]] = []
    for record in hf.records():
        if not changes or changes[-1][1] != record["phase"]:
            changes.append((record["step"], record["phase"]))
    visits = [(step, phase) for step in (8, 16, 20) for phase in ("eval", "checkpoint", "train")]
    assert changes[1:] == visits, changes
    # Every save recorded as it landed; save_total_limit kept the Trainer's last two.
    assert hf.record["path"] == str(hf.output / "checkpoint-20")
    assert sorted(p.name for p in hf.output.iterdir()) == ["checkpoint-16", "checkpoint-20"]


@pytest.mark.parametrize(
    ("fault", "phase"),
    [(("--hang-in", "eval"), "eval"), (("--hang-in", "save"), "checkpoint"), (("--hang-at", "9"), None)],
    ids=["in-eval", "in-save", "in-training-right-after-a-save"],
)
def test_hf_trainer_hang_stalls_after_its_phases_timeout(
    hf: KitTrainer, fault: tuple[str, str], phase: str | None
) -> None:
    run = hf.soak(hf.one_rank("--max-steps", "100", "--every", "8", *fault), *TIMEOUTS)
    assert run.code == 12, run.stderr
    reason = run.artifact["failure_reason"]
    if phase is not None:
        assert f"in phase {phase} (its stale timeout: 35s)" in reason, reason
    else:  # the save at step 8 landed: the hang is training's, with training's timeout
        assert hf.record["step"] == 8
        idle = re.search(r"did not change for ([0-9.]+)s", reason)
        assert idle is not None and 15 <= float(idle.group(1)) < 35 and "in phase" not in reason, reason
    assert run.stack_has_line(hf.script, "time.sleep(1)  # the hung"), run.artifact["stacks"]


def test_hf_trainer_stops_at_the_margin_on_two_ranks_with_its_checkpoint_on_disk(hf: KitTrainer) -> None:
    run = hf.soak(hf.two_ranks("--max-steps", "100000"), "--budget", "75", "--checkpoint-margin", "35")
    assert run.code == 14, run.stderr
    assert run.artifact["failure_classification"] == "deadline_exhausted"
    record = hf.record
    saved = Path(record["path"])
    assert saved.is_dir() and saved.name == f"checkpoint-{record['step']}" and record["bytes"] > 0
    assert (saved / "trainer_state.json").is_file() and (saved / "optimizer.pt").is_file()
    assert run.shutdown["classification"] == "external_cancellation"
    assert run.artifact["phases"]["checkpoint"] is not None  # the sidecar saw the record land
    exit_record = run.artifact["post_shutdown"]["launcher_exit"]
    # Stopped by the soft stop, never killed. The ranks may act on the soft-stop file before the
    # launcher's signal reaches them; having acted, the kit ignores late copies, so the launcher
    # then finds no handler to signal: either path is the soft stop.
    assert exit_record["soft_stop_sent"] and not exit_record["kill_sent"] and not exit_record["term_sent"]


def test_hf_trainer_stopped_from_outside_resumes_from_its_checkpoint_volume_by_itself(hf: KitTrainer) -> None:
    """The run's record on a volume of its own (as the chart's checkpoint.existingClaim gives a
    pod): the Trainer's output_dir is there, and the next attempt resumes with no hand step."""
    volume = hf.tmp / "volume"
    command = hf.one_rank("--max-steps", "60", "--step-s", "0.1")  # every attempt runs the same
    flags = ("--budget", "900", "--checkpoint", str(volume / "checkpoint.json"), "--auto-resume")
    first = hf.start(command, *flags)
    hf.wait_for_step(5)
    first.send_signal(signal.SIGTERM)
    stopped = hf.finish(first)
    assert stopped.code == 17, stopped.stderr
    record = hf.record
    assert 5 <= record["step"] < 60, record
    assert record["path"] == str(volume / f"checkpoint-{record['step']}")
    resumed = hf.soak(command, *flags)
    assert resumed.code == 0, resumed.stderr
    assert f"soak_sidecar_kit: resuming from {record['path']}" in resumed.console
    assert hf.steps_written().count(1) == 1  # the second attempt did not restart
    assert resumed.artifact["run_summary"]["steps"] == 60
    assert resumed.artifact["deadline"]["resumed_from"] == str(volume / "checkpoint.json")


def test_hf_trainer_crash_is_the_trainers_failure(hf: KitTrainer) -> None:
    run = hf.soak(hf.one_rank("--max-steps", "100", "--crash-at", "5"))
    assert run.code == 10, run.stderr
    assert run.shutdown["classification"] == "learner_failure"
    assert run.shutdown["exception"]["message"] == "crash requested at step 5"


def test_hf_trainer_hang_on_two_ranks_is_a_stall_with_the_hung_line(hf: KitTrainer) -> None:
    run = hf.soak(hf.two_ranks("--max-steps", "100000", "--hang-at", "5"), "--stale-progress", "10")
    assert run.code == 12, run.stderr
    assert run.artifact["failure_classification"] == "timeout/stale_tick"
    assert run.stack_has_line(hf.script, "time.sleep(1)  # the hung"), run.artifact["stacks"]
