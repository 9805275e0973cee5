"""The trainer kit's torchtitan adapter on torchtitan 0.3 (the trainer venv), under the real CLI: the
two-line adoption of tests/trainers/torchtitan_trainer.py (torchtitan's own train loop and DCP
checkpointer; what needs CUDA is replaced, as its docstring says) passes, with a validation longer
than the train timeout, stops at the checkpoint margin on two ranks with a resumable DCP checkpoint on
disk, stops from outside and resumes from that checkpoint on the next attempt, fails on a crash, and
is a stall when a rank hangs, right after a save by the train timeout."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from tests.components import require
from tests.fixtures.kit_runs import KitTrainer

pytestmark = [pytest.mark.integration, pytest.mark.trainers]


@pytest.fixture
def titan(tmp_path: Path) -> KitTrainer:
    python = require("trainer-venv")
    return KitTrainer(
        python, tmp_path, "torchtitan_trainer.py", "--dump-folder", "5c7e1a90-2d4b-4e8f-a613-9b0c2d4e6f71"
    )


def test_torchtitan_passes_and_a_fresh_soak_in_the_same_folder_starts_afresh(titan: KitTrainer) -> None:
    """The first soak leaves its final (model-only) step in the dump folder; torchtitan alone would
    load it on the next run and fail. A soak loads only what it approved: none, on a fresh run."""
    for _ in range(2):
        run = titan.soak(titan.one_rank("--steps", "20"))
        assert run.code == 0, run.stderr
        summary = run.artifact["run_summary"]
        assert summary["status"] == "completed" and summary["steps"] == 20 and summary["tokens"] > 0
        assert run.shutdown["owner"] == "torchtitan"
    assert (titan.output / "checkpoint" / "step-20").is_dir()
    assert titan.steps_written().count(1) == 2 and any(r.get("loss") for r in titan.records())


# A train timeout shorter than the slow validation, the eval phase's own longer.
TIMEOUTS = ("--stale-progress", "10", "--stale-eval", "40", "--stale-checkpoint", "40")


def test_torchtitan_validation_longer_than_the_train_timeout_is_the_eval_phase(titan: KitTrainer) -> None:
    """In the other form: the soak attached to a trainer built already."""
    run = titan.soak(
        titan.one_rank("--steps", "12", "--checkpoint-interval", "5", "--validate-s", "15", "--attach"),
        *TIMEOUTS,
    )
    assert run.code == 0, run.stderr
    progress = run.artifact["resource_summary"]["progress"]
    longest = {each["phase"]: each["longest_visit_s"] for each in progress["phase_timeouts"]}
    assert longest["eval"] > 10, longest
    # The validation at step 1 in eval, each save in checkpoint (the model-only last one too, though
    # not recorded), training again at once after.
    changes: list[tuple[int, str]] = []
    for record in titan.records():
        if not changes or changes[-1][1] != record["phase"]:
            changes.append((record["step"], record["phase"]))
    visits = [(1, "eval"), (1, "train")]
    visits += [(step, phase) for step in (5, 10, 12) for phase in ("checkpoint", "train")]
    assert changes[1:] == visits, changes
    assert titan.record["step"] == 10


def test_torchtitan_hang_right_after_a_save_stalls_after_the_train_timeout(titan: KitTrainer) -> None:
    command = titan.one_rank("--steps", "100", "--checkpoint-interval", "5", "--hang-at", "6")
    run = titan.soak(command, *TIMEOUTS)
    assert run.code == 12, run.stderr
    assert titan.record["step"] == 5  # the save landed: the hang is training's, with training's timeout
    reason = run.artifact["failure_reason"]
    idle = re.search(r"did not change for ([0-9.]+)s", reason)
    assert idle is not None and 10 <= float(idle.group(1)) < 40 and "in phase" not in reason, reason
    assert run.stack_has_line(titan.script, "time.sleep(1)  # the hung"), run.artifact["stacks"]


def test_torchtitan_stops_at_the_margin_on_two_ranks_with_a_resumable_checkpoint(titan: KitTrainer) -> None:
    run = titan.soak(titan.two_ranks("--steps", "100000"), "--budget", "75", "--checkpoint-margin", "35")
    assert run.code == 14, run.stderr
    assert run.artifact["failure_classification"] == "deadline_exhausted"
    record = titan.record
    saved = Path(record["path"])
    assert saved == titan.output / "checkpoint" / f"step-{record['step']}"
    # A full DCP checkpoint, not the model-only final save: both ranks' shards and the metadata.
    assert (saved / ".metadata").is_file() and len(list(saved.glob("*.distcp"))) == 2
    assert record["bytes"] > 0
    assert run.shutdown["classification"] == "external_cancellation"
    assert run.artifact["phases"]["checkpoint"] is not None  # the sidecar saw the record land
    exit_record = run.artifact["post_shutdown"]["launcher_exit"]
    # Stopped by the soft stop, never killed. The ranks may act on the soft-stop file before the
    # launcher's signal reaches them; having acted, the kit ignores late copies, so the launcher
    # then finds no handler to signal: either path is the soft stop.
    assert exit_record["soft_stop_sent"] and not exit_record["kill_sent"] and not exit_record["term_sent"]


def test_torchtitan_stopped_from_outside_resumes_from_its_checkpoint_volume_by_itself(
    titan: KitTrainer,
) -> None:
    """The run's record on a volume of its own (as the chart's checkpoint.existingClaim gives a
    pod): the checkpointer saves there, and the next attempt resumes from it with no hand step."""
    volume = titan.tmp / "volume"
    command = titan.one_rank("--steps", "60", "--step-s", "0.1", "--checkpoint-interval", "5")
    flags = ("--budget", "900", "--checkpoint", str(volume / "checkpoint.json"), "--auto-resume")
    first = titan.start(command, *flags)
    titan.wait_for_step(7)
    first.send_signal(signal.SIGTERM)
    stopped = titan.finish(first)
    assert stopped.code == 17, stopped.stderr
    record = titan.record
    assert 7 <= record["step"] < 60, record
    assert record["path"] == str(volume / "checkpoint" / f"step-{record['step']}")
    resumed = titan.soak(command, *flags)
    assert resumed.code == 0, resumed.stderr
    assert f"soak_sidecar_kit: resuming from {record['path']}" in resumed.console
    assert titan.steps_written().count(1) == 1  # the second attempt went on from the checkpoint
    assert resumed.artifact["run_summary"]["steps"] == 60
    assert resumed.artifact["deadline"]["resumed_from"] == str(volume / "checkpoint.json")


def test_torchtitans_own_entry_point_on_two_ranks_stops_and_resumes_with_no_line_changed(
    titan: KitTrainer,
) -> None:
    run = [str(titan.python), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    entry = ["-m", "soak_sidecar_kit.torchtitan", "--module", "tests.trainers.torchtitan_trainer"]
    command = [
        *run,
        *entry,
        "--config",
        "cpu_debug",
        "--training.steps",
        "200",
        "--dump-folder",
        str(titan.output),
    ]
    first = titan.start(command, "--budget", "900")
    titan.wait_for_step(5)
    first.send_signal(signal.SIGTERM)
    stopped = titan.finish(first)
    assert stopped.code == 17, stopped.stderr
    assert stopped.shutdown["owner"] == "torchtitan"
    record = titan.record
    assert len(list(Path(record["path"]).glob("*.distcp"))) == 2
    resumed = titan.soak(command, "--resume-checkpoint", str(titan.progress / "checkpoint.json"))
    assert resumed.code == 0, resumed.stderr
    assert f"soak_sidecar_kit: resuming from {record['path']}" in resumed.console
    assert titan.steps_written().count(1) == 1
    assert resumed.artifact["run_summary"]["steps"] == 200


def test_torchtitan_crash_is_the_trainers_failure(titan: KitTrainer) -> None:
    run = titan.soak(titan.one_rank("--steps", "100", "--crash-at", "5"))
    assert run.code == 10, run.stderr
    assert run.shutdown["classification"] == "learner_failure"
    assert run.shutdown["exception"]["message"] == "crash requested at step 5"


def test_torchtitan_hang_on_two_ranks_is_a_stall_with_the_hung_line(titan: KitTrainer) -> None:
    run = titan.soak(titan.two_ranks("--steps", "100000", "--hang-at", "5"), "--stale-progress", "10")
    assert run.code == 12, run.stderr
    assert run.artifact["failure_classification"] == "timeout/stale_tick"
    assert run.stack_has_line(titan.script, "time.sleep(1)  # the hung"), run.artifact["stacks"]
