"""The watch loop's rules, as the pure policy the monitoring loop drives: time is an argument."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sidecar.core.classification import Classification, Finding, Source
from sidecar.core.gpu_health import gpu_fault
from sidecar.core.monitor_policy import CONTINUE, MonitorPolicy, MonitorTimings, Observation, lock_loss
from sidecar.core.samples import ProgressSample

TIMINGS = MonitorTimings(
    sample_interval_s=2.0,
    startup_timeout_s=30.0,
    stale_progress_s=10.0,
    progress_signal="bytes",
    fallback_after_s=5.0,
)


def progress(total: int) -> ProgressSample:
    return ProgressSample(file_count=1 if total else 0, bytes_total=total, max_mtime=None)


def test_samples_on_the_interval_and_judges_liveness_in_between() -> None:
    policy = MonitorPolicy(TIMINGS, started=100.0)
    assert TIMINGS.liveness_interval_s == 1.0  # a tenth of the shortest timeout, at most the interval
    assert policy.due(100.0) == "sample"
    assert policy.due(100.5) is None
    assert policy.due(101.0) == "liveness"
    assert policy.due(101.5) is None
    assert policy.due(102.0) == "sample"
    assert policy.sleep_s(102.0) == pytest.approx(0.1)  # never more than 0.1 s between steps
    assert policy.sleep_s(102.999) == pytest.approx(0.005)  # nor less than 5 ms


def test_progress_that_stops_changing_asks_for_a_terminate_once() -> None:
    policy = MonitorPolicy(TIMINGS, started=0.0)
    assert policy.step(1.0, Observation(progress(10))) == CONTINUE
    assert policy.step(11.0, Observation(progress(10))) == CONTINUE  # 10 s idle: not yet over
    action = policy.step(11.5, Observation(progress(10)))
    assert action.stop == "terminate" and "did not change for 10.5s" in action.reason
    assert policy.failure is not None and policy.failure.kind == "timeout/stale_tick"
    assert policy.step(12.0, Observation(progress(10))) == CONTINUE  # asked once, then waits


def test_a_trainer_that_never_writes_fails_the_startup_timeout() -> None:
    policy = MonitorPolicy(TIMINGS, started=0.0)
    assert policy.step(29.0, Observation(progress(0))) == CONTINUE
    action = policy.step(31.0, Observation(progress(0)))
    assert action.stop == "terminate"
    assert policy.failure is not None and policy.failure.kind == "timeout/startup"


def test_a_lost_lock_kills_at_once_and_is_the_monitor_failure() -> None:
    policy = MonitorPolicy(TIMINGS, started=0.0)
    action = policy.step(1.0, Observation(progress(5), lock_loss=lock_loss("lease taken by pod-b")))
    assert action.stop == "kill" and action.reason == "deadline lock lost: lease taken by pod-b"
    assert policy.failure == lock_loss("lease taken by pod-b")
    assert policy.failure.kind == "monitor_failure"


def test_a_gpu_fault_is_kept_and_terminates() -> None:
    policy = MonitorPolicy(TIMINGS, started=0.0)
    action = policy.step(1.0, Observation(progress(5), gpu_fault=gpu_fault("Xid 79 on GPU 0")))
    assert action.stop == "terminate" and action.reason == "GPU fault: Xid 79 on GPU 0"
    assert policy.gpu_fault == gpu_fault("Xid 79 on GPU 0")
    policy.step(2.0, Observation(progress(6), gpu_fault=gpu_fault("Xid 48 on GPU 1")))
    assert policy.gpu_fault == gpu_fault("Xid 79 on GPU 0")  # the first fault is the one reported


def test_the_deadline_is_the_second_line_behind_the_launcher() -> None:
    policy = MonitorPolicy(TIMINGS, started=0.0)
    assert policy.step(1.0, Observation(progress(5), deadline_expired=False)) == CONTINUE
    action = policy.step(2.0, Observation(progress(6), deadline_expired=True))
    assert action.stop == "kill" and action.reason == "total-job deadline expired"
    assert policy.failure is None  # the deadline verdict comes from the conclusion, not from here


def test_the_first_reason_wins_when_several_arrive_together() -> None:
    policy = MonitorPolicy(TIMINGS, started=0.0)
    both = Observation(
        progress(5), gpu_fault=gpu_fault("Xid 79"), lock_loss=lock_loss("lease gone"), deadline_expired=True
    )
    action = policy.step(1.0, both)
    assert action.stop == "kill" and action.reason.startswith("deadline lock lost")


def test_a_launcher_that_does_not_act_in_time_gets_the_kill_fallback() -> None:
    policy = MonitorPolicy(TIMINGS, started=0.0)
    assert policy.step(1.0, Observation(deadline_expired=True)).stop == "kill"
    assert policy.step(6.0, Observation(deadline_expired=True)) == CONTINUE  # 5 s: the limit itself
    assert policy.fallback_kill is None
    action = policy.step(6.1, Observation(deadline_expired=True))
    assert action.kill_remembered and action.stop is None
    assert action.reason == policy.fallback_kill  # a finding for the verdict, not only an action
    assert policy.fallback_kill is not None and "the sidecar killed" in policy.fallback_kill


def test_a_launcher_still_running_past_the_deadline_is_remembered() -> None:
    policy = MonitorPolicy(TIMINGS, started=0.0)
    policy.step(1.0, Observation())
    assert not policy.ran_past_deadline
    policy.step(2.0, Observation(deadline_expired=True))
    policy.step(3.0, Observation())
    assert policy.ran_past_deadline


def test_a_stall_asks_for_stacks_and_waits_for_them_before_the_fallback() -> None:
    policy = MonitorPolicy(replace(TIMINGS, stack_capture_s=3.0), started=0.0)
    policy.step(1.0, Observation(progress(10)))
    action = policy.step(11.5, Observation(progress(10)))
    assert action.stop == "terminate" and action.stacks_timeout_s == 3.0 and policy.stacks_requested
    assert policy.step(11.5 + 5.0 + 3.0, Observation()) == CONTINUE  # fallback + the stacks' bound
    assert policy.step(11.5 + 5.0 + 3.1, Observation()).kill_remembered


@pytest.mark.parametrize(
    "seen",
    [
        Observation(progress(5), gpu_fault=gpu_fault("Xid 79")),
        Observation(progress(5), lock_loss=lock_loss("lease gone")),
        Observation(progress(5), deadline_expired=True),
    ],
)
def test_only_a_stall_asks_for_stacks(seen: Observation) -> None:
    policy = MonitorPolicy(replace(TIMINGS, stack_capture_s=3.0), started=0.0)
    action = policy.step(1.0, seen)
    assert action.stop is not None and action.stacks_timeout_s == 0.0 and not policy.stacks_requested


def test_an_interruption_decides_the_failure_over_what_came_before() -> None:
    policy = MonitorPolicy(TIMINGS, started=0.0)
    policy.step(11.0, Observation(progress(0)))
    policy.step(31.0, Observation(progress(0)))
    cancelled = Finding(Classification.EXTERNAL_CANCELLATION, "soak was interrupted", Source.SIDECAR)
    policy.interrupted(cancelled)
    assert policy.failure == cancelled


def test_progress_age_counts_from_the_last_change() -> None:
    policy = MonitorPolicy(TIMINGS, started=0.0)
    assert policy.progress_age(5.0) is None
    policy.step(5.0, Observation(progress(1)))
    policy.step(7.0, Observation(progress(1)))
    assert policy.progress_age(8.0) == pytest.approx(3.0)


def test_a_throughput_drop_stops_the_trainer_with_a_terminate_and_is_the_failure() -> None:
    policy = MonitorPolicy(TIMINGS, started=0.0)
    cause = Finding(Classification.THROUGHPUT_DROPPED, "the throughput drops 40 % an hour", Source.SIDECAR)
    action = policy.step(1.0, Observation(progress(10), throughput_drop=cause))
    assert action.stop == "terminate" and action.reason == cause.reason and action.stacks_timeout_s == 0
    assert policy.failure == cause
