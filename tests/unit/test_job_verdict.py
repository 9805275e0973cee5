"""The job-level verdict of single-pod and multi-pod (Indexed) soaks."""

from __future__ import annotations

from sidecar.core.job_verdict import AttemptOutcome, job_verdict


def outcome(index: int | None, attempt: int, passed: bool, indexes: int | None = 2) -> AttemptOutcome:
    return AttemptOutcome(
        index=index, attempt=attempt, passed=passed, indexes=None if index is None else indexes
    )


def test_a_single_pod_soak_is_its_latest_attempt() -> None:
    assert job_verdict([outcome(None, 1, False), outcome(None, 2, True)], job_condition=None).passed
    failed = job_verdict([outcome(None, 1, True), outcome(None, 2, False)], job_condition="Failed")
    assert not failed.passed and failed.reason == "attempt 2 did not pass"
    assert job_verdict([], job_condition=None).reason == "the Job has no pods"


def test_every_index_must_pass_and_the_job_be_complete() -> None:
    passed = [outcome(0, 1, True), outcome(1, 1, False), outcome(1, 2, True)]
    verdict = job_verdict(passed, job_condition="Complete")
    assert verdict.passed and verdict.reason == "all 2 indexes passed and the Job is Complete"
    running = job_verdict(passed, job_condition=None)
    assert not running.passed and running.reason == "the Job is not Complete"


def test_a_failed_index_a_missing_index_and_a_failed_job_are_each_named() -> None:
    verdict = job_verdict(
        [outcome(0, 1, True, indexes=3), outcome(2, 1, False, indexes=3)], job_condition="Failed"
    )
    assert not verdict.passed
    assert verdict.reason == "index 1 has no pod; index 2 attempt 1 did not pass; the Job is Failed"


def test_a_retried_index_counts_by_its_latest_attempt_only() -> None:
    outcomes = [outcome(0, 1, True), outcome(1, 1, True), outcome(1, 2, False)]
    assert (
        job_verdict(outcomes, job_condition="Failed").reason
        == "index 1 attempt 2 did not pass; the Job is Failed"
    )
