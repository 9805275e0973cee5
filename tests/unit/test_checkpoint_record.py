"""The trainer's checkpoint record (a claim): one validating parser, and only *that* it changed
is taken, at the sidecar's own time."""

from __future__ import annotations

import pytest

from sidecar.core.errors import ConfigError
from sidecar.core.ledger.checkpoint import CHECKPOINT_LIMIT_BYTES, CheckpointReport, parse_checkpoint
from sidecar.core.ledger.moments import ProgressMoments


def test_a_full_record_and_the_example_trainers_minimal_one() -> None:
    full = parse_checkpoint(b'{"step": 1200, "path": "ckpt/1200", "bytes": 7340032, "duration_s": 4.2}')
    assert full == CheckpointReport(step=1200, path="ckpt/1200", bytes=7340032, duration_s=4.2)
    assert parse_checkpoint(b'{"step": 0}') == CheckpointReport(step=0)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"", "not JSON"),
        (b"[" * 60_000, "not JSON"),
        (b"[]", "not a JSON object"),
        (b"{}", "step must be an integer"),
        (b'{"step": -1}', "step must be an integer"),
        (b'{"step": true}', "step must be an integer"),
        (b'{"step": 1.5}', "step must be an integer"),
        (b'{"step": 1, "bytes": 1e3}', "bytes must be an integer"),
        (b'{"step": 1, "duration_s": NaN}', "duration_s must be a finite"),
        (b'{"step": 1, "duration_s": -2}', "duration_s must be a finite"),
        (b'{"step": 1, "path": 7}', "path must be text"),
        (b'{"step": 1, "path": "' + b"x" * 5000 + b'"}', "path must be text"),
        (b" " * (CHECKPOINT_LIMIT_BYTES + 1), "larger than"),
    ],
)
def test_anything_else_is_one_line_saying_what_is_wrong(data: bytes, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        parse_checkpoint(data)


def test_a_checkpoint_counts_when_its_record_changes_at_the_sample_that_showed_it() -> None:
    moments = ProgressMoments()
    moments.observe(100.0, 0, None)
    moments.observe(101.0, 10, CheckpointReport(step=1))
    moments.observe(102.0, 20, CheckpointReport(step=1))  # the same record again
    moments.observe(103.0, 30, "checkpoint.json is not JSON")  # being rewritten: not counted
    assert (moments.first_progress_unix, moments.checkpoint_seen_unix, moments.checkpoints_seen) == (
        101.0,
        101.0,
        1,
    )
    moments.observe(104.0, 40, CheckpointReport(step=2))
    assert (moments.checkpoint, moments.checkpoint_seen_unix, moments.checkpoints_seen) == (
        CheckpointReport(step=2),
        104.0,
        2,
    )
    assert moments.checkpoint_problem == "checkpoint.json is not JSON"


def test_a_checkpoint_written_after_the_last_sample_counts_when_the_trainer_has_exited() -> None:
    """A soft stop's checkpoint often lands between the last sample and the trainer's exit: the
    look once it has exited counts it (seen then), and a record unchanged since adds nothing."""
    moments = ProgressMoments()
    moments.observe(100.0, 10, CheckpointReport(step=1))
    moments.observe_checkpoint(107.0, CheckpointReport(step=1))
    assert (moments.checkpoint_seen_unix, moments.checkpoints_seen) == (100.0, 1)
    moments.observe_checkpoint(108.0, CheckpointReport(step=9))
    assert (moments.checkpoint, moments.checkpoint_seen_unix, moments.checkpoints_seen) == (
        CheckpointReport(step=9),
        108.0,
        2,
    )
    assert moments.first_progress_unix == 100.0


def test_the_record_an_earlier_attempt_left_is_not_this_attempts_checkpoint() -> None:
    moments = ProgressMoments(inherited=CheckpointReport(step=7))
    moments.observe(100.0, 10, CheckpointReport(step=7))
    assert (moments.checkpoint, moments.checkpoints_seen) == (None, 0)
    moments.observe(105.0, 20, CheckpointReport(step=12))
    assert (moments.checkpoint, moments.checkpoint_seen_unix, moments.checkpoints_seen) == (
        CheckpointReport(step=12),
        105.0,
        1,
    )
