"""The finish estimate of a steady run (issue 46: the ETA within 10 % of the actual finish at the
half-way point): a simulated trainer, its step time jittered per step, sampled as the sidecar
samples it, time as arguments. ``bench/eta_accuracy.py`` measures the same through the real CLI.

At half-way the estimate's error is the rate's relative error (remaining steps / rate): a rate off
by more than 10 % either way (an eta over all steps instead of the remaining ones, a window timed
by samples rather than by the clock, ...) fails here; the jitter's own share is well under 1 %.
"""

from __future__ import annotations

import bisect
import itertools
import random

import pytest

from sidecar.core.eta import StepRate, eta_s

TOLERANCE = 0.10


def halfway(seed: int, total: int, step_s: float = 0.5, sample_s: float = 5.0) -> tuple[float, float]:
    """The ETA at the first sample at or past half-way and the simulated finish minus that sample's
    time: ``total`` steps of ``step_s`` ±10 % each (seeded), sampled every ``sample_s`` from the
    trainer's start by the sidecar's clock, each sample seeing the steps completed by then."""
    rng = random.Random(seed)
    done = list(itertools.accumulate(step_s * rng.uniform(0.9, 1.1) for _ in range(total)))
    rate, now = StepRate(), sample_s
    while (step := bisect.bisect_right(done, now)) < total // 2:
        rate.observe(now, step)
        now += sample_s
    rate.observe(now, step)
    eta = eta_s(step, total, rate.per_s())
    assert eta is not None  # an hour of samples is a rate
    return eta, done[-1] - now


@pytest.mark.parametrize("seed", range(5))
def test_the_eta_of_a_steady_run_is_within_10_percent_of_the_finish_at_half_way(seed: int) -> None:
    """7200 steps of 0.5 s (an hour), sampled every 5 s: the rate rests on the last 10 minutes."""
    eta, actual = halfway(seed, total=7200)
    assert abs(eta - actual) <= TOLERANCE * actual, (seed, eta, actual)


@pytest.mark.parametrize("seed", range(5))
def test_the_eta_of_steps_longer_than_the_sample_interval_is_within_3_percent_at_half_way(seed: int) -> None:
    """240 steps of 30 s (2 h), sampled every 5 s: timed from the sample that last saw the step, each
    step would lose up to an interval and the rate be off by up to one step in its window (5 %)."""
    eta, actual = halfway(seed, total=240, step_s=30.0)
    assert abs(eta - actual) <= 0.03 * actual, (seed, eta, actual)
