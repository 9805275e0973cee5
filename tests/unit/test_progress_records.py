"""Structured progress records: one validating parser, read as they are appended; the phase's own
stale timeout; the step rate and the finish against the deadline."""

from __future__ import annotations

import contextlib
import json
import os
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.adapters.progress import MAX_RECORDS_READ, DirectoryProgressProbe, RecordTail
from sidecar.core.errors import ConfigError
from sidecar.core.eta import NOTE_MIN_SPAN_S, StepRate, StepTimes, eta_s, finish_note
from sidecar.core.liveness import LivenessTracker
from sidecar.core.progress_records import (
    MAX_PARSED_LINES,
    RECORD_LINE_LIMIT,
    ProgressRecord,
    RecordsRead,
    parse_record,
    read_records,
)
from sidecar.core.samples import ProgressSample


def line(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_a_record_names_its_step_phase_counts_and_declared_total() -> None:
    found = parse_record(
        line(step=120, phase="checkpoint", samples=3840, tokens=1e6, loss=2.5, total_steps=500, t=1.0)
    )
    assert found == ProgressRecord(120, "checkpoint", 3840.0, 1e6, 2.5, 500)
    assert parse_record(line(step=0)) == ProgressRecord(0)  # phase train by default, the rest unknown
    assert parse_record(line(step=3, loss=None)).loss is None  # a loss the trainer could not compute


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (line(phase="train"), "step must be an integer"),
        (line(step=-1), "step must be an integer from 0"),
        (line(step=True), "step must be an integer"),
        (line(step=1.5), "step must be an integer"),
        (line(step=2**60), "step must be an integer"),
        (line(step=1, phase="sleeping"), "phase must be one of train, eval, checkpoint, data, compile"),
        (line(step=1, total_steps=0), "total_steps must be an integer from 1"),
        (line(step=1, samples=-3), "samples must be a number from 0"),
        (b'{"step": 1, "loss": NaN}', "loss must be a finite number or null"),
        (b" " * (RECORD_LINE_LIMIT + 1), f"longer than {RECORD_LINE_LIMIT} bytes"),
        (b"[" * 4000, "not JSON"),  # nested past the parser's recursion limit
    ],
)
def test_a_bad_record_is_refused_with_one_line(raw: bytes, said: str) -> None:
    with pytest.raises(ConfigError, match=said.replace("(", r"\(")):
        parse_record(raw)


@given(st.binary(max_size=2 * RECORD_LINE_LIMIT))
def test_any_bytes_give_a_record_or_a_refusal(raw: bytes) -> None:
    with contextlib.suppress(ConfigError):
        parse_record(raw)


def test_the_newest_valid_line_counts_and_the_refused_after_it_are_counted() -> None:
    found = read_records(line(step=1) + b"\n" + line(step=2) + b"\n\ngarbage\n" + line(step=-5) + b"\n")
    assert found.newest == ProgressRecord(2) and found.refused == 2
    assert found.first_refusal is not None and "step must be" in found.first_refusal
    # Lines older than the newest valid record are superseded, not parsed.
    assert read_records(b"garbage\n" + line(step=3) + b"\n") == RecordsRead(ProgressRecord(3), 0)


def test_a_flood_of_junk_costs_a_bounded_number_of_parses() -> None:
    flood = line(step=1) + b"\n" + b"0\n" * (3 * MAX_PARSED_LINES)
    found = read_records(flood)
    # The valid record is beyond the lines parsed: not taken; every junk line is counted.
    assert found.newest is None and found.refused == 3 * MAX_PARSED_LINES + 1


def test_the_tail_reads_complete_lines_as_they_are_appended(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    tail = RecordTail(str(path))
    tail.read()  # no file yet: nothing, no error
    assert tail.newest is None
    path.write_bytes(line(step=1) + b"\n" + line(step=2)[:5])  # the second line half written
    tail.read()
    assert tail.newest == ProgressRecord(1)
    with path.open("ab") as out:
        out.write(line(step=2)[5:] + b"\n")
    tail.read()
    assert tail.newest == ProgressRecord(2) and tail.refused == 0


def test_a_rotated_file_is_read_from_its_start_and_a_backlog_from_its_newest_lines(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    tail = RecordTail(str(path))
    path.write_bytes(b"".join(line(step=n, pad="x" * 200) + b"\n" for n in range(10)))
    tail.read()
    assert tail.newest is not None and tail.newest.step == 9
    os.replace(path, tmp_path / "progress.jsonl.1")
    path.write_bytes(line(step=3) + b"\n")  # the kit started it again: an earlier step is the newest
    tail.read()
    assert tail.newest == ProgressRecord(3)
    backlog = b"".join(line(step=n, pad="y" * 100) + b"\n" for n in range(4, 10_000))
    assert len(backlog) > 4 * MAX_RECORDS_READ
    with path.open("ab") as out:
        out.write(backlog)
    tail.read()
    assert tail.newest is not None and tail.newest.step == 9_999 and tail.refused == 0


def test_a_link_or_a_fifo_is_never_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(line(step=99) + b"\n")
    (tmp_path / "progress.jsonl").symlink_to(secret)
    tail = RecordTail(str(tmp_path / "progress.jsonl"))
    tail.read()
    assert tail.newest is None
    (tmp_path / "progress.jsonl").unlink()
    os.mkfifo(tmp_path / "progress.jsonl")
    tail.read()  # no hang on a FIFO with no writer
    assert tail.newest is None


def test_the_probe_carries_the_newest_record_in_its_sample(tmp_path: Path) -> None:
    (tmp_path / "progress.jsonl").write_bytes(line(step=7, phase="eval", total_steps=10) + b"\nbad\n")
    sample = DirectoryProgressProbe(tmp_path, exclude=[]).sample()
    assert (sample.step, sample.phase, sample.total_steps, sample.records_refused) == (7, "eval", 10, 1)
    assert sample.bytes_total > 0  # the records count as progress too


PHASES = {"eval": 60.0, "checkpoint": 30.0, "data": 20.0, "compile": 90.0}


def progress(size: int, phase: str = "train") -> ProgressSample:
    return ProgressSample(file_count=1, bytes_total=size, max_mtime=float(size), step=size, phase=phase)


def test_a_long_checkpoint_is_not_a_stall_and_a_hang_in_it_is_within_its_own_timeout() -> None:
    """A 30 s checkpoint phase under a 5 s train timeout: no stall; a hang inside it: a stall once
    the checkpoint's own timeout has passed."""
    tracker = LivenessTracker(100.0, 5.0, 0.0, phase_stale_s={**PHASES, "checkpoint": 40.0})
    assert tracker.observe(progress(1), 1.0) is None
    assert tracker.observe(progress(2, "checkpoint"), 2.0) is None  # the phase begins
    for now in range(3, 33):
        assert tracker.observe(progress(2, "checkpoint"), float(now)) is None
    assert tracker.observe(progress(3), 33.0) is None  # back to training, in time
    hung = LivenessTracker(100.0, 5.0, 0.0, phase_stale_s=PHASES)
    hung.observe(progress(2, "checkpoint"), 2.0)
    assert hung.observe(progress(2, "checkpoint"), 31.0) is None
    stalled = hung.observe(progress(2, "checkpoint"), 32.5)
    assert stalled is not None and stalled.kind == "timeout/stale_tick"
    assert stalled.reason == (
        "training progress did not change for 30.5s in phase checkpoint (its stale timeout: 30s)"
    )


def test_a_phase_declared_forever_is_still_a_stall_and_train_keeps_its_words() -> None:
    tracker = LivenessTracker(100.0, 5.0, 0.0, phase_stale_s=PHASES)
    tracker.observe(progress(1, "compile"), 1.0)
    assert tracker.observe(progress(1, "compile"), 91.5) is not None
    train = LivenessTracker(100.0, 5.0, 0.0, phase_stale_s=PHASES)
    train.observe(progress(1), 1.0)
    found = train.observe(progress(1), 6.5)
    assert found is not None and found.reason == "training progress did not change for 5.5s"


def test_the_rate_follows_the_recent_window_and_starts_again_when_steps_go_back() -> None:
    rate = StepRate(window_s=60.0)
    assert rate.per_s() is None
    rate.observe(0.0, 0)
    rate.observe(1.0, 2)
    assert rate.per_s() is None  # less than MIN_SPAN_S apart: not yet a rate
    for t in range(3, 121):
        rate.observe(float(t), 2 * t if t < 60 else 120 + (t - 60))  # 2 steps/s, then 1 step/s
    assert rate.per_s() == pytest.approx(1.0, rel=0.05)  # the last minute only
    rate.observe(121.0, 5)  # a resumed attempt began again
    assert rate.per_s() is None
    rate.observe(130.0, None)  # a sample without a record changes nothing
    assert rate.per_s() is None


def test_the_rate_is_timed_from_where_each_step_was_first_seen_and_falls_while_one_runs_long() -> None:
    rate = StepRate()
    for t in range(0, 296, 5):
        rate.observe(float(t), t // 30)  # 30 s steps, sampled every 5 s: step 9 first seen at 270
    assert rate.per_s() == pytest.approx(1 / 30) and rate.mean_per_s() == pytest.approx(1 / 30)
    assert rate.span_s() == 295.0  # up to the newest sample, as the note counts it
    rate.observe(400.0, 9)  # step 10 is overdue: at most 10 steps in 400 s
    assert rate.per_s() == pytest.approx(10 / 400) and rate.mean_per_s() == pytest.approx(10 / 400)


def test_a_step_time_spans_the_samples_from_where_its_step_was_first_seen() -> None:
    times = StepTimes()
    for t, step in ((0, 5), (5, 5), (10, 6), (15, 2), (20, 2), (25, 2), (30, 3)):
        times.observe(float(t), step)
    # 5 -> 6 in 10 s; the counter went back at 15 s (no step time), 2 -> 3 from there in 15 s.
    assert times.pace(30.0).median_s == 12.5


def test_the_eta_and_the_one_line_when_the_run_would_pass_the_soft_stop() -> None:
    assert eta_s(100, 1000, 2.0) == 450.0
    assert eta_s(1000, 1000, None) == 0.0 and eta_s(10, None, 2.0) is None and eta_s(10, 20, 0.0) is None
    assert finish_note(450.0, 600.0, rate_span_s=600.0) is None
    assert finish_note(3 * 3600 + 600, 2 * 3600 + 2400, rate_span_s=600.0) == (
        "at this rate the run needs 3 h 10 min more; 2 h 40 min remain before the deadline's soft stop"
    )
    # A rate resting on less than a minute of records says nothing yet.
    assert finish_note(3 * 3600 + 600, 2 * 3600 + 2400, rate_span_s=NOTE_MIN_SPAN_S - 1) is None


def simulated_step_times(growth_per_hour: float, minutes: float, seed: int) -> StepTimes:
    """A trainer sampled every 5 s for ``minutes``, its step time 0.5 s growing by
    ``growth_per_hour`` (0.2: 20 % an hour), each step's time jittered by 10 %."""
    rng = random.Random(seed)
    times, t, step, next_sample = StepTimes(), 0.0, 0, 5.0
    while t < minutes * 60:
        t += 0.5 * (1 + growth_per_hour * t / 3600) * rng.uniform(0.9, 1.1)
        step += 1
        if t >= next_sample:
            times.observe(t, step)
            next_sample += 5.0
    return times


def test_a_step_time_growing_20_percent_an_hour_is_seen_within_30_minutes_and_clean_runs_are_not() -> None:
    slowing = simulated_step_times(0.2, 30, seed=1).trend()
    assert slowing is not None and slowing.low_per_hour > 0 and slowing.unit == "s"
    assert slowing.per_hour == pytest.approx(0.1, rel=0.3)  # 20 % of 0.5 s an hour
    for seed in range(10):
        clean = simulated_step_times(0.0, 30, seed=seed).trend()
        assert clean is not None and clean.low_per_hour <= 0 <= clean.high_per_hour, (seed, clean)


def test_a_step_that_goes_back_gives_no_step_time_and_keeps_the_trend() -> None:
    times = StepTimes()
    for t in range(10):
        times.observe(float(t), 10 * t)
    before = times.trend()
    times.observe(11.0, 3)  # a counter reset (or a forged step): no step time, nothing restarted
    assert before is not None and times.trend() == before
    times.observe(12.0, 13)  # counting on from the reset: 10 steps in 1 s, as before
    after = times.trend()
    assert after is not None and after.points == before.points + 1 and after.per_hour == 0.0


def test_a_record_naming_a_key_twice_is_refused() -> None:
    """As every document the sidecar judges: json.loads would keep the last of the two."""
    with pytest.raises(ConfigError, match="duplicate key 'phase'"):
        parse_record(b'{"step": 3, "phase": "checkpoint", "phase": "train"}')
