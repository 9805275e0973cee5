"""Phase timeouts calibrated from the attempt's own history (monitor.phase_calibration_factor): once a
phase has completed a visit, its stale timeout is the factor times its longest visit, at least the
train timeout, at most the configured one. Pure: time is an argument."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.errors import ConfigError
from sidecar.core.liveness import LivenessTracker
from sidecar.core.monitor_policy import MonitorPolicy, MonitorTimings, Observation
from sidecar.core.phase_timeouts import PhaseTimeout, PhaseTimeouts
from sidecar.core.samples import ProgressSample
from sidecar.settings import load_settings

TRAIN_S = 5.0
PHASES = {"eval": 1800.0, "checkpoint": 1800.0, "data": 600.0, "compile": 3600.0}


class Trainer:
    """A trainer's progress records as the samples show them: each record grows the file."""

    def __init__(self, tracker: LivenessTracker) -> None:
        self.tracker = tracker
        self.size = 0

    def record(self, phase: str, now: float) -> str | None:
        self.size += 1
        return self.look(phase, now)

    def look(self, phase: str, now: float) -> str | None:
        """A sample with no new record: the reason of a stall, else None."""
        sample = ProgressSample(
            file_count=1, bytes_total=self.size, max_mtime=0.0, step=self.size, phase=phase
        )
        found = self.tracker.observe(sample, now)
        return None if found is None else found.reason

    def train(self, start: float, seconds: int) -> float:
        for now in range(int(start), int(start) + seconds):
            assert self.record("train", float(now)) is None
        return start + seconds

    def visit(self, phase: str, start: float, seconds: float) -> float:
        """A visit of ``seconds`` with no record meanwhile, sampled every second, then train."""
        assert self.record(phase, start) is None
        for now in range(int(start) + 1, int(start + seconds)):
            assert self.look(phase, float(now)) is None, f"a stall at {now}"
        assert self.record("train", start + seconds) is None
        return start + seconds


def tracker(factor: float | None, **phases: float) -> Trainer:
    return Trainer(
        LivenessTracker(
            100.0, TRAIN_S, 0.0, phase_stale_s={**PHASES, **phases}, phase_calibration_factor=factor
        )
    )


@pytest.mark.parametrize("factor", [None, 3.0])
def test_a_30s_checkpoint_under_a_5s_train_timeout_is_not_a_stall(factor: float | None) -> None:
    trainer = tracker(factor)
    now = trainer.train(1.0, 10)
    now = trainer.visit("checkpoint", now, 30.0)
    trainer.train(now, 10)


def test_after_a_10s_checkpoint_a_second_that_hangs_stalls_after_30s_not_1800s() -> None:
    trainer = tracker(3.0)
    now = trainer.train(1.0, 10)
    now = trainer.visit("checkpoint", now, 10.0)
    now = trainer.train(now, 10)
    assert trainer.record("checkpoint", now) is None  # the second checkpoint begins, and hangs
    assert trainer.look("checkpoint", now + 29.5) is None  # a visit as long as 3x the first is fine
    assert trainer.look("checkpoint", now + 30.5) == (
        "training progress did not change for 30.5s in phase checkpoint "
        "(its stale timeout: 30s, calibrated: 3x the longest seen, 10s)"
    )


def test_each_phase_is_calibrated_from_its_own_visits_only() -> None:
    trainer = tracker(3.0)
    now = trainer.visit("checkpoint", trainer.train(1.0, 5), 10.0)
    assert trainer.record("eval", now) is None  # eval has no visit yet: its configured 1800 s
    assert trainer.look("eval", now + 1799.0) is None
    assert trainer.look("eval", now + 1800.5) == (
        "training progress did not change for 1800.5s in phase eval (its stale timeout: 1800s)"
    )


def test_without_calibration_the_configured_timeout_applies_as_before() -> None:
    trainer = tracker(None)
    now = trainer.visit("checkpoint", trainer.train(1.0, 10), 10.0)
    now = trainer.train(now, 10)
    assert trainer.record("checkpoint", now) is None
    assert trainer.look("checkpoint", now + 1799.5) is None
    assert trainer.look("checkpoint", now + 1800.5) == (
        "training progress did not change for 1800.5s in phase checkpoint (its stale timeout: 1800s)"
    )
    (checkpoint,) = [found for found in trainer.tracker.phase_timeouts() if found.phase == "checkpoint"]
    assert checkpoint == PhaseTimeout(phase="checkpoint", configured_s=1800.0, longest_visit_s=10.0)


def test_the_train_timeout_is_the_floor() -> None:
    """A 1 s checkpoint under factor 3 would give 3 s: the train timeout (5 s) applies instead."""
    trainer = tracker(3.0)
    now = trainer.visit("checkpoint", trainer.train(1.0, 5), 1.0)
    now = trainer.train(now, 5)
    assert trainer.record("checkpoint", now) is None
    assert trainer.look("checkpoint", now + 4.5) is None
    assert trainer.look("checkpoint", now + 5.5) == (
        "training progress did not change for 5.5s in phase checkpoint "
        "(its stale timeout: 5s, calibrated: 3x the longest seen, 1s, at least the train timeout)"
    )


def test_the_configured_timeout_is_the_cap_and_a_phase_held_forever_is_still_a_stall() -> None:
    """A 50 s compile under factor 3 and a 100 s compile timeout: 150 s would loosen it; 100 s holds."""
    trainer = tracker(3.0, compile=100.0)
    now = trainer.visit("compile", trainer.train(1.0, 5), 50.0)
    assert trainer.record("compile", now) is None  # declared, and never left
    assert trainer.look("compile", now + 99.5) is None
    assert trainer.look("compile", now + 100.5) == (
        "training progress did not change for 100.5s in phase compile (its stale timeout: 100s)"
    )
    (compile_,) = [found for found in trainer.tracker.phase_timeouts() if found.phase == "compile"]
    assert compile_ == PhaseTimeout(
        phase="compile", configured_s=100.0, longest_visit_s=50.0, calibrated_s=100.0
    )


def test_the_artifact_states_every_phase_and_a_visit_ends_at_any_other_phase() -> None:
    phases = PhaseTimeouts(TRAIN_S, PHASES, factor=3.0)
    phases.observe("data", 10.0)
    phases.observe("checkpoint", 22.0)  # data -> checkpoint: the data visit took 12 s
    phases.observe("checkpoint", 25.0)
    phases.observe("train", 30.0)
    phases.observe("data", 40.0)
    phases.observe("train", 44.0)  # a shorter data visit leaves the longest as it was
    phases.observe("eval", 50.0)  # still going: no completed visit
    assert phases.stated() == [
        PhaseTimeout(phase="eval", configured_s=1800.0),
        PhaseTimeout(phase="checkpoint", configured_s=1800.0, longest_visit_s=8.0, calibrated_s=24.0),
        PhaseTimeout(phase="data", configured_s=600.0, longest_visit_s=12.0, calibrated_s=36.0),
        PhaseTimeout(phase="compile", configured_s=3600.0),
    ]
    assert (phases.timeout_s("train"), phases.timeout_s("eval"), phases.timeout_s("data")) == (
        5.0,
        1800.0,
        36.0,
    )


def test_a_phase_without_a_configured_timeout_keeps_the_train_timeout() -> None:
    trainer = Trainer(LivenessTracker(100.0, TRAIN_S, 0.0, phase_calibration_factor=3.0))
    now = trainer.visit("checkpoint", trainer.train(1.0, 3), 2.0)
    assert trainer.record("checkpoint", now) is None
    assert trainer.look("checkpoint", now + 5.5) == (
        "training progress did not change for 5.5s in phase checkpoint (its stale timeout: 5s)"
    )
    assert trainer.tracker.phase_timeouts() == []


@given(
    visits=st.lists(
        st.tuples(st.sampled_from(["train", "eval", "checkpoint", "data", "compile"]), st.floats(0.0, 1e5)),
        max_size=30,
    ),
    factor=st.floats(1.0, 1000.0),
)
def test_calibration_never_loosens_a_timeout_nor_goes_below_the_train_timeout(
    visits: list[tuple[str, float]], factor: float
) -> None:
    phases, now = PhaseTimeouts(TRAIN_S, PHASES, factor), 0.0
    for phase, seconds in visits:
        phases.observe(phase, now)
        now += seconds
    for phase, configured in PHASES.items():
        assert TRAIN_S <= phases.timeout_s(phase) <= configured


def test_the_policy_states_the_phases_of_its_liveness_tracker() -> None:
    timings = MonitorTimings(
        sample_interval_s=1.0,
        startup_timeout_s=100.0,
        stale_progress_s=TRAIN_S,
        progress_signal="any",
        fallback_after_s=5.0,
        phase_stale_s=PHASES,
        phase_calibration_factor=2.0,
    )
    policy = MonitorPolicy(timings, started=0.0)
    for now, size, phase in ((1.0, 1, "train"), (2.0, 2, "eval"), (9.0, 3, "train")):
        policy.step(
            now, Observation(ProgressSample(file_count=1, bytes_total=size, max_mtime=0.0, phase=phase))
        )
    (eval_,) = [found for found in policy.phase_timeouts() if found.phase == "eval"]
    assert (eval_.longest_visit_s, eval_.calibrated_s) == (7.0, 14.0)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0.5", "greater than or equal to 1"),
        ("1001", "less than or equal to 1000"),
        ("nan", "finite number"),
        ("inf", "finite number"),
    ],
)
def test_a_factor_below_one_absurd_or_not_finite_is_refused(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"monitor\.phase_calibration_factor: .*{message}"):
        load_settings({"monitor.phase_calibration_factor": value})


def test_calibration_is_off_by_default() -> None:
    assert load_settings({}).monitor.phase_calibration_factor is None
    assert load_settings({"monitor.phase_calibration_factor": "3"}).monitor.phase_calibration_factor == 3.0
