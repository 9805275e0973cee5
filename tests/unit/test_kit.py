"""The trainer kit on its own: what it writes where, the soft stop, and the summary's class."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.progress_records import parse_record, read_records
from sidecar.core.run_summary.evaluate import SummaryOutcome, evaluate_run_summary
from soak_sidecar_kit import PROGRESS_MAX_BYTES, Soak


@pytest.fixture
def restore_usr1() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    (tmp_path / "progress").mkdir(exist_ok=True)
    return {
        "SOAK_PROGRESS_DIR": str(tmp_path / "progress"),
        "SOAK_SOFT_STOP_FILE": str(tmp_path / "run" / "soft-stop"),
        "SOAK_SOFT_STOP_SIGNAL": "SIGUSR1",
        **extra,
    }


def summary(tmp_path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((tmp_path / "progress" / "run_summary.json").read_text())
    return document


def core_outcome(tmp_path: Path) -> SummaryOutcome:
    raw = (tmp_path / "progress" / "run_summary.json").read_bytes()
    return evaluate_run_summary(
        raw, mtime=None, run_started_wall=None, max_bytes=1 << 20, manifest_validator=None, profile="core"
    )


def test_a_run_that_ends_writes_a_completed_core_summary(tmp_path: Path, restore_usr1: None) -> None:
    with Soak(environ=env(tmp_path), owner="test") as soak:
        for step in range(1, 4):
            soak.progress(step, samples=step * 8, loss=1.0 / step)
    document = summary(tmp_path)
    assert document["status"] == "completed" and document["steps"] == 3 and document["samples"] == 24
    assert document["runtime_manifest"]["shutdown"]["classification"] == "normal_completion"
    outcome = core_outcome(tmp_path)
    assert outcome.classification is None and not outcome.failures, outcome


def test_progress_is_one_line_a_second_and_a_phase_change_at_once(tmp_path: Path, restore_usr1: None) -> None:
    soak = Soak(environ=env(tmp_path), progress_interval_s=3600)
    for step in range(1, 50):
        soak.progress(step, loss=float("nan") if step == 1 else 0.5)
    with soak.phase("eval"):
        pass
    lines = [json.loads(line) for line in (tmp_path / "progress" / "progress.jsonl").read_text().splitlines()]
    assert [(line["step"], line["phase"]) for line in lines] == [(1, "train"), (49, "eval"), (49, "train")]
    assert lines[0]["loss"] is None and lines[0]["loss_nonfinite"] is True


def test_every_line_the_kit_writes_is_a_record_the_sidecar_reads_with_its_total(
    tmp_path: Path, restore_usr1: None
) -> None:
    with Soak(environ=env(tmp_path), progress_interval_s=0) as soak:
        for step in soak.steps(0, 5):
            soak.progress(
                step, samples=step * 4, tokens=step * 1024.0, loss=float("inf") if step == 2 else 1.0
            )
        with soak.phase("checkpoint"):
            pass
    raw = (tmp_path / "progress" / "progress.jsonl").read_bytes()
    found = read_records(raw)
    assert found.refused == 0 and found.newest is not None
    records = [parse_record(line) for line in raw.splitlines()]
    assert {record.total_steps for record in records} == {5}
    assert [r.phase for r in records][-2:] == ["checkpoint", "train"] and records[2].loss is None


def test_progress_is_bounded_on_disk(tmp_path: Path, restore_usr1: None) -> None:
    soak = Soak(environ=env(tmp_path), progress_interval_s=0)
    path = tmp_path / "progress" / "progress.jsonl"
    path.write_bytes(b"x" * (PROGRESS_MAX_BYTES + 1))
    soak.progress(1)
    assert path.stat().st_size < 100 and (tmp_path / "progress" / "progress.jsonl.1").exists()


def test_the_soft_stop_signal_stops_and_late_copies_are_ignored(tmp_path: Path, restore_usr1: None) -> None:
    soak = Soak(environ=env(tmp_path))
    assert not soak.should_stop()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert soak.stop_requested and soak.should_stop()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGUSR1)  # a late copy: ignored, not fatal
    soak.finish()
    shutdown = summary(tmp_path)["runtime_manifest"]["shutdown"]
    assert summary(tmp_path)["status"] == "failed" and shutdown["classification"] == "external_cancellation"


def test_the_steps_end_at_the_soft_stop_with_the_checkpoint_saved_and_recorded(
    tmp_path: Path, restore_usr1: None
) -> None:
    soak = Soak(environ=env(tmp_path))
    saved: list[str] = []

    def save(path: str) -> None:
        Path(path).write_bytes(b"w" * 10)
        saved.append(path)

    ran = []
    with soak:
        for step in soak.steps(3, 100, save=save, path=tmp_path / "ckpt.bin"):
            ran.append(step)
            if step == 5:
                os.kill(os.getpid(), signal.SIGUSR1)
    assert ran == [3, 4, 5] and saved == [str(tmp_path / "ckpt.bin")]
    record = json.loads((tmp_path / "progress" / "checkpoint.json").read_text())
    assert (record["step"], record["path"], record["bytes"]) == (6, str(tmp_path / "ckpt.bin"), 10)
    assert summary(tmp_path)["runtime_manifest"]["shutdown"]["classification"] == "external_cancellation"
    assert list(Soak(environ={}).steps(0, 3)) == [0, 1, 2]  # no stop asked: the whole range


def test_the_soft_stop_file_stops(tmp_path: Path, restore_usr1: None) -> None:
    soak = Soak(environ=env(tmp_path))
    (tmp_path / "run").mkdir()
    assert not soak.should_stop()
    (tmp_path / "run" / "soft-stop").touch()
    assert soak.should_stop()


def test_a_handler_installed_before_the_kit_still_runs(tmp_path: Path, restore_usr1: None) -> None:
    seen: list[int] = []
    signal.signal(signal.SIGUSR1, lambda signum, _frame: seen.append(signum))
    soak = Soak(environ=env(tmp_path))
    os.kill(os.getpid(), signal.SIGUSR1)
    assert soak.stop_requested and seen == [signal.SIGUSR1]


def test_ranks_agree_through_the_given_reduction(tmp_path: Path, restore_usr1: None) -> None:
    """Another rank got the signal: this one stops at the same step although it saw nothing."""
    soak = Soak(environ=env(tmp_path), reduce_max=lambda values: [1, *values[1:]])
    assert not soak.stop_requested and soak.should_stop()


def test_an_exception_is_the_trainers_failure_unless_the_stop_caused_it(
    tmp_path: Path, restore_usr1: None
) -> None:
    with pytest.raises(RuntimeError), Soak(environ=env(tmp_path)):
        raise RuntimeError("boom")
    shutdown = summary(tmp_path)["runtime_manifest"]["shutdown"]
    assert shutdown["classification"] == "learner_failure"
    assert shutdown["exception"] == {"type": "RuntimeError", "message": "boom"}
    assert core_outcome(tmp_path).classification == "learner_failure"
    (tmp_path / "progress" / "run_summary.json").unlink()
    with pytest.raises(RuntimeError), Soak(environ=env(tmp_path)) as soak:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert soak.stop_requested
        raise RuntimeError("DataLoader worker (pid 7) is killed by signal: Terminated.")
    assert summary(tmp_path)["runtime_manifest"]["shutdown"]["classification"] == "external_cancellation"


def test_only_local_rank_zero_writes(tmp_path: Path, restore_usr1: None) -> None:
    with Soak(environ=env(tmp_path, LOCAL_RANK="1", RANK="3")) as soak:
        soak.progress(1)
        soak.checkpoint(1, tmp_path)
    assert list((tmp_path / "progress").iterdir()) == []


def test_a_checkpoint_record_is_what_the_next_attempt_resumes_from(
    tmp_path: Path, restore_usr1: None
) -> None:
    saved = tmp_path / "ckpt" / "step-7.ckpt"
    saved.parent.mkdir()
    saved.write_bytes(b"w" * 1234)
    Soak(environ=env(tmp_path)).checkpoint(7, saved, duration_s=0.25)
    record_path = tmp_path / "progress" / "checkpoint.json"
    record = json.loads(record_path.read_text())
    assert (record["step"], record["path"], record["bytes"], record["duration_s"]) == (
        7,
        str(saved),
        1234,
        0.25,
    )
    resumed = Soak(environ=env(tmp_path, SOAK_RESUME_CHECKPOINT=str(record_path)))
    assert (resumed.resume_checkpoint, resumed.resume_step) == (str(saved), 7)
    # An approved file that is not a kit record is itself what to load.
    other = Soak(environ=env(tmp_path, SOAK_RESUME_CHECKPOINT=str(saved)))
    assert (other.resume_checkpoint, other.resume_step) == (str(saved), None)
    assert Soak(environ=env(tmp_path)).resume_checkpoint is None


def test_outside_a_soak_it_writes_nothing_and_still_answers(
    tmp_path: Path, restore_usr1: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with Soak(environ={}) as soak:
        soak.progress(1)
        soak.checkpoint(1)
        assert not soak.should_stop()
    assert list(tmp_path.iterdir()) == []


def test_a_save_sets_no_phase_and_every_record_keeps_the_total(tmp_path: Path, restore_usr1: None) -> None:
    """What follows a save is judged as the phase the trainer is in (the train timeout after a save,
    not the checkpoint one), and the newest record, a save's included, still declares the total."""
    soak = Soak(environ=env(tmp_path), progress_interval_s=3600, total_steps=40)
    soak.progress(9)
    with soak.phase("checkpoint", 10):
        (tmp_path / "ckpt").write_bytes(b"w")
    soak.checkpoint(10, tmp_path / "ckpt")
    raw = (tmp_path / "progress" / "progress.jsonl").read_bytes()
    records = [parse_record(line) for line in raw.splitlines()]
    assert [(r.step, r.phase) for r in records] == [
        (9, "train"),
        (10, "checkpoint"),
        (10, "train"),
        (10, "train"),
    ]
    assert {r.total_steps for r in records} == {40}
    newest = read_records(raw).newest
    assert newest is not None and (newest.phase, newest.total_steps) == ("train", 40)
    soak.progress(14)
    soak.checkpoint(12, tmp_path / "ckpt")  # an asynchronous save of step 12 lands at step 14
    raw = (tmp_path / "progress" / "progress.jsonl").read_bytes()
    assert [parse_record(line).step for line in raw.splitlines()][-1] == 14
    assert json.loads((tmp_path / "progress" / "checkpoint.json").read_text())["step"] == 12


def test_what_the_sidecar_would_refuse_is_not_written(tmp_path: Path, restore_usr1: None) -> None:
    soak = Soak(environ=env(tmp_path), progress_interval_s=0)
    soak.progress(3, samples=-5, tokens=2.0**60)  # counts out of the contract's range: left out
    soak.checkpoint(3, "/" + "x" * 5000)  # a path the sidecar would refuse: the record without it
    with pytest.raises(ValueError, match="phase"):
        soak.progress(4, phase="validation")
    with pytest.raises(ValueError, match="step"):
        soak.progress(-1)
    raw = (tmp_path / "progress" / "progress.jsonl").read_bytes()
    assert read_records(raw).refused == 0
    assert [parse_record(line).samples for line in raw.splitlines()] == [None, None]
    record = json.loads((tmp_path / "progress" / "checkpoint.json").read_text())
    assert record["step"] == 3 and "path" not in record


def test_a_record_that_cannot_be_written_is_logged_not_raised(
    tmp_path: Path, restore_usr1: None, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "progress").mkdir()
    (tmp_path / "progress" / "progress.jsonl").mkdir()  # not a file: every append fails
    soak = Soak(environ=env(tmp_path), progress_interval_s=0)
    soak.progress(1)
    soak.progress(2)
    assert len(caplog.records) == 1 and "progress.jsonl" in caplog.records[0].getMessage()
