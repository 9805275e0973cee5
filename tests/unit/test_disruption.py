"""Why a soak was stopped from outside, from the pod's and the Job's status (core/disruption)."""

from __future__ import annotations

import pytest

from sidecar.core.classification import Source
from sidecar.core.disruption import StopEvidence, cause_of_stop, decisive_cause
from sidecar.core.exitcodes import ExitCode
from sidecar.core.pod_facts import Condition, JobFacts, PodFacts
from sidecar.core.verdict import exit_code_for

RUNNING_JOB = JobFacts(name="soak")


def pod(*conditions: Condition, deleting: bool = False) -> PodFacts:
    return PodFacts(name="soak-0", uid="u", deleting=deleting, conditions=conditions)


def disrupted(reason: str, message: str = "msg") -> PodFacts:
    return pod(Condition("DisruptionTarget", "True", reason, message), deleting=True)


@pytest.mark.parametrize(
    ("reason", "kind", "words"),
    [
        ("EvictionByEvictionAPI", "evicted", "Eviction API"),
        ("PreemptionByScheduler", "preempted", "preempted"),
        ("PreemptionByKubeScheduler", "preempted", "preempted"),
        ("DeletionByTaintManager", "node_disruption", "NoExecute"),
        ("TerminationByKubelet", "node_disruption", "kubelet"),
        ("DeletionByPodGC", "node_disruption", "garbage collector"),
        ("SomethingNewInKubernetes", "node_disruption", "disrupted"),
    ],
)
def test_a_disruption_target_names_its_cause(reason: str, kind: str, words: str) -> None:
    evidence = StopEvidence("SIGTERM", pod=disrupted(reason, "Eviction API: evicting"), job=RUNNING_JOB)
    found = decisive_cause(evidence)
    assert found is not None
    assert found.kind == kind and words in found.reason
    assert found.reason.endswith(f"({reason}: Eviction API: evicting)")
    assert exit_code_for(found.kind) == ExitCode.CANCELLED


def test_a_condition_that_is_not_true_is_no_cause() -> None:
    evidence = StopEvidence(
        "SIGTERM", pod=pod(Condition("DisruptionTarget", "False", "EvictionByEvictionAPI"))
    )
    assert decisive_cause(evidence) is None
    assert cause_of_stop(evidence).kind == "external_cancellation"


def test_the_jobs_word_comes_before_the_pods() -> None:
    """A Job suspended (or failed, or deleted) stops its pods: that is the cause, not the deletion."""
    suspended = JobFacts(name="soak", suspended=True)
    found = cause_of_stop(StopEvidence("SIGTERM", pod=pod(deleting=True), job=suspended))
    assert found.kind == "job_suspended" and "same deadline" in found.reason
    failed = JobFacts(
        name="soak", conditions=(Condition("FailureTarget", "True", "BackoffLimitExceeded", "2 failed"),)
    )
    found = cause_of_stop(StopEvidence("SIGTERM", pod=disrupted("EvictionByEvictionAPI"), job=failed))
    assert (found.kind, found.reason, found.source) == (
        "job_failed",
        "the Job failed, so this pod was stopped: BackoffLimitExceeded: 2 failed",
        Source.PLATFORM,
    )
    assert cause_of_stop(StopEvidence("SIGTERM", pod=pod(deleting=True), job_gone=True)).kind == "job_deleted"
    deleting = JobFacts(name="soak", deleting=True, suspended=True)
    assert cause_of_stop(StopEvidence("SIGTERM", job=deleting)).kind == "job_deleted"


def test_a_deleted_pod_without_a_recorded_disruption_is_pod_deleted() -> None:
    evidence = StopEvidence("SIGTERM", pod=pod(deleting=True), job=RUNNING_JOB)
    assert decisive_cause(evidence) is None  # it may still show up: the caller waits a moment
    assert cause_of_stop(evidence).kind == "pod_deleted"


@pytest.mark.parametrize(
    ("signal", "said"), [("SIGINT", "Ctrl-C"), ("SIGTERM", "SIGTERM"), ("SIGHUP", "SIGHUP")]
)
def test_locally_the_signal_is_named(signal: str, said: str) -> None:
    found = cause_of_stop(StopEvidence(signal))
    assert (found.kind, found.source) == ("external_cancellation", Source.SIDECAR)
    assert found.reason == f"soak was interrupted before the trainer completed: the sidecar got {said}"


def test_a_hostile_condition_message_is_bounded_and_sanitized() -> None:
    evidence = StopEvidence("SIGTERM", pod=disrupted("EvictionByEvictionAPI", "x\n\x1b[31m" + "y" * 10_000))
    found = decisive_cause(evidence)
    assert found is not None
    assert len(found.reason) < 500 and "\x1b" not in found.reason and "\n" not in found.reason
