"""The throughput rule (sidecar.core.throughput) on simulated step times: a slowdown beyond doubt
is a note, a drop past monitor.max_throughput_drop_pct the cause throughput_dropped (exit 21),
per hour or against the first hour; clean runs and one long checkpoint step raise nothing."""

from __future__ import annotations

import random

import pytest

from sidecar.core.classification import Classification, Finding, Source, Standing
from sidecar.core.eta import StepTimes
from sidecar.core.exitcodes import ExitCode
from sidecar.core.throughput import (
    ThroughputLimit,
    drop_per_hour_pct,
    drop_since_first_hour_pct,
    throughput_finding,
)
from sidecar.core.verdict import exit_code_for

PER_HOUR_20 = ThroughputLimit(max_drop_pct=20.0)
FIRST_HOUR_20 = ThroughputLimit(max_drop_pct=20.0, basis="first_hour")


def simulated(
    growth_per_hour: float, minutes: float, seed: int, *, checkpoint_every_s: float = 0.0
) -> StepTimes:
    """A trainer sampled every 5 s, its step time 0.5 s growing ``growth_per_hour`` (0.2: 20 % an
    hour), jittered by 10 %; a 60 s checkpoint every ``checkpoint_every_s`` (0: none)."""
    rng = random.Random(seed)
    times, t, step, next_sample, next_checkpoint = (
        StepTimes(),
        0.0,
        0,
        5.0,
        checkpoint_every_s or float("inf"),
    )
    while t < minutes * 60:
        t += 0.5 * (1 + growth_per_hour * t / 3600) * rng.uniform(0.9, 1.1)
        if t >= next_checkpoint:
            t, next_checkpoint = t + 60.0, next_checkpoint + checkpoint_every_s
        step += 1
        if t >= next_sample:
            times.observe(t, step)
            next_sample = t + 5.0
    return times


def judged(times: StepTimes, minutes: float, limit: ThroughputLimit) -> Finding | None:
    return throughput_finding(times.pace(minutes * 60), limit)


def test_a_step_time_growing_20_percent_an_hour_is_a_note_within_30_minutes() -> None:
    found = judged(simulated(0.2, 30, seed=1), 30, ThroughputLimit())
    assert found is not None and found.standing is Standing.NOTE and found.source is Source.SIDECAR
    assert found.kind is Classification.THROUGHPUT_DROPPED
    assert found.reason.startswith("training slows down: the step time grows ")


@pytest.mark.parametrize("seed", range(10))
def test_ten_clean_runs_raise_nothing_even_with_checkpoints(seed: int) -> None:
    for times in (simulated(0.0, 30, seed), simulated(0.0, 90, seed, checkpoint_every_s=600)):
        assert judged(times, 90, PER_HOUR_20) is None
        assert judged(times, 90, ThroughputLimit()) is None


def test_a_drop_past_the_limit_per_hour_is_the_cause_and_exits_21() -> None:
    times = simulated(1.0, 30, seed=2)  # the step time doubles in an hour: half the throughput
    pace = times.pace(1800.0)
    drop = drop_per_hour_pct(pace)
    assert drop is not None and 20.0 < drop < 50.0, drop  # the low end: never more than the truth
    found = throughput_finding(pace, PER_HOUR_20)
    assert found is not None and found.standing is Standing.CAUSE
    assert "more than monitor.max_throughput_drop_pct 20 % an hour" in found.reason
    assert exit_code_for(found.kind) is ExitCode.THROUGHPUT_DROPPED and int(ExitCode.THROUGHPUT_DROPPED) == 21
    # Under a limit it does not reach, the same slowdown is only a note.
    below = throughput_finding(pace, ThroughputLimit(max_drop_pct=60.0))
    assert below is not None and below.standing is Standing.NOTE


def test_against_the_first_hour_only_once_it_is_over() -> None:
    times = simulated(0.5, 100, seed=3)
    assert drop_since_first_hour_pct(times.pace(3599.0)) is None
    pace = times.pace(6000.0)
    drop = drop_since_first_hour_pct(pace)
    # Step time 0.5 s x (1 + t / 2 h): its median over the first hour at 30 min (0.625 s), over
    # the last 10 minutes at 95 min (0.896 s).
    assert drop is not None and drop == pytest.approx(100 * (1 - 0.625 / 0.896), abs=3.0)
    found = throughput_finding(pace, FIRST_HOUR_20)
    assert found is not None and found.standing is Standing.CAUSE
    assert "against the first hour" in found.reason
    assert throughput_finding(simulated(0.0, 100, seed=3).pace(6000.0), FIRST_HOUR_20) is None


def test_a_step_counter_that_goes_back_does_not_wipe_the_rules_evidence() -> None:
    """A trainer whose counter restarts every 8 samples (each epoch, or to hide a slowdown) still
    has its slowdown judged: the pair that goes back gives no step time, the rest count."""
    rng = random.Random(4)
    times, t, step = StepTimes(), 0.0, 0
    while t < 1800:
        t += 5.0
        step = 0 if step >= 8 * 10 else step + round(5.0 / (0.5 * (1 + t / 3600)) * rng.uniform(0.95, 1.05))
        times.observe(t, step)
    found = throughput_finding(times.pace(t), PER_HOUR_20)
    assert found is not None and found.standing is Standing.CAUSE, found


def long_steps(first_s: float, last_s: float, minutes: float, seed: int) -> StepTimes:
    """A trainer whose step time goes from ``first_s`` to ``last_s`` over ``minutes``, jittered by
    5 %, sampled every 5 s from a moment unrelated to its start: many samples per step."""
    rng = random.Random(seed)
    times, t, step, now = StepTimes(), 0.0, 0, rng.uniform(0.0, 5.0)
    while now < minutes * 60:
        while t <= now:  # the steps done by this sample
            t += (first_s + (last_s - first_s) * t / (minutes * 60)) * rng.uniform(0.95, 1.05)
            step += 1
        times.observe(now, step - 1)
        now += 5.0
    return times


@pytest.mark.parametrize("seed", range(5))
def test_steps_longer_than_the_sample_interval_are_timed_whole(seed: int) -> None:
    """Steady 30 s steps read as 30 s (not as one 5 s sample interval) and raise nothing."""
    pace = long_steps(30.0, 30.0, 90, seed).pace(5400.0)
    assert pace.median_s == pytest.approx(30.0, abs=1.0) and pace.recent_s == pytest.approx(30.0, abs=1.0)
    assert throughput_finding(pace, PER_HOUR_20) is None
    assert throughput_finding(pace, FIRST_HOUR_20) is None


@pytest.mark.parametrize("seed", range(5))
def test_a_long_step_that_grows_from_20_to_40_s_passes_the_limit(seed: int) -> None:
    pace = long_steps(20.0, 40.0, 70, seed).pace(4200.0)
    assert pace.recent_s == pytest.approx(39.0, abs=2.5), pace  # the last 10 minutes' median
    found = throughput_finding(pace, PER_HOUR_20)
    assert found is not None and found.standing is Standing.CAUSE, found
    assert exit_code_for(found.kind) is ExitCode.THROUGHPUT_DROPPED
