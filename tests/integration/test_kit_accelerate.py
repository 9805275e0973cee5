"""The trainer kit in a loop of one's own on accelerate's Accelerator (the trainer venv), as
docs/trainers.md shows, under the real CLI on two ranks: stopped from outside, both ranks stop at the
same step with accelerate's own checkpoint of it (save_state) on disk and recorded, and the next
attempt resumes both from it (load_state) and finishes."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from tests.components import require
from tests.fixtures.kit_runs import KitTrainer

pytestmark = [pytest.mark.integration, pytest.mark.trainers]


@pytest.fixture
def accelerate(tmp_path: Path) -> KitTrainer:
    python = require("trainer-venv")
    return KitTrainer(
        python, tmp_path, "accelerate_trainer.py", "--output-dir", "3e9b1c70-5a2d-4f18-8c64-0d7e2a9b4f15"
    )


def test_accelerate_loop_on_two_ranks_stops_at_one_step_and_resumes(accelerate: KitTrainer) -> None:
    command = accelerate.two_ranks("--steps", "60", "--step-s", "0.1", "--every", "5")
    first = accelerate.start(command, "--budget", "900")
    accelerate.wait_for_step(7)
    first.send_signal(signal.SIGTERM)
    stopped = accelerate.finish(first)
    assert stopped.code == 17, stopped.stderr
    assert stopped.shutdown["classification"] == "external_cancellation"
    ended = set(re.findall(r"rank (\d) ended at step (\d+)", stopped.console))
    assert {rank for rank, _ in ended} == {"0", "1"} and len({step for _, step in ended}) == 1, ended
    (stop_step,) = {int(step) for _, step in ended}
    record = accelerate.record
    assert 7 <= record["step"] == stop_step < 60, record
    assert record["path"] == str(accelerate.output / "soak-stop")
    saved = Path(record["path"])
    assert (saved / "model.safetensors").is_file() and len(list(saved.glob("random_states_*.pkl"))) == 2
    resumed = accelerate.soak(command, "--resume-checkpoint", str(accelerate.progress / "checkpoint.json"))
    assert resumed.code == 0, resumed.stderr
    assert sorted(re.findall(r"rank (\d) resumed from step (\d+)", resumed.console)) == [
        ("0", str(stop_step)),
        ("1", str(stop_step)),
    ]
    assert accelerate.steps_written().count(1) == 1  # the second attempt went on from the checkpoint
    assert resumed.artifact["run_summary"]["steps"] == 60
    assert accelerate.record["path"] == str(accelerate.output / "step-60")
