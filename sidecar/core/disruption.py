"""Why a soak was stopped from outside: the cause named from what the API (or the signal) says.

Kubernetes stops a pod for many reasons, and the signal alone cannot tell them apart. The Job and
the pod record why: the Job's ``FailureTarget``/``Failed`` conditions and ``spec.suspend``, the Job
gone, the pod's ``DisruptionTarget`` condition (set before the pod is deleted by an eviction, a
preemption, a taint or the kubelet) and its deletion timestamp. Each cause is a classification of
its own under CANCELLED (exit 17; a suspended Job 153, which the chart's podFailurePolicy ignores).
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.classification import Classification, Finding, Source
from sidecar.core.job_pods import job_failure
from sidecar.core.pod_facts import JobFacts, PodFacts
from sidecar.core.publication import sanitize

INTERRUPTED_REASON = "soak was interrupted before the trainer completed"
MESSAGE_CHARS = 240

# DisruptionTarget reasons (k8s.io/api/core/v1) -> classification and what it means.
DISRUPTION_REASONS: dict[str, tuple[Classification, str]] = {
    "EvictionByEvictionAPI": (
        Classification.EVICTED,
        "the pod was evicted through the Eviction API (kubectl drain, an autoscaler)",
    ),
    "PreemptionByScheduler": (
        Classification.PREEMPTED,
        "the scheduler preempted the pod for a higher-priority one",
    ),
    "PreemptionByKubeScheduler": (
        Classification.PREEMPTED,
        "the scheduler preempted the pod for a higher-priority one",
    ),
    "DeletionByTaintManager": (
        Classification.NODE_DISRUPTION,
        "the node was tainted NoExecute and the pod does not tolerate it",
    ),
    "TerminationByKubelet": (
        Classification.NODE_DISRUPTION,
        "the kubelet terminated the pod (node-pressure eviction or graceful node shutdown)",
    ),
    "DeletionByPodGC": (
        Classification.NODE_DISRUPTION,
        "the pod garbage collector deleted the pod (its node is gone)",
    ),
}


@dataclass(frozen=True)
class StopEvidence:
    """What is known when the sidecar is asked to stop."""

    signal: str | None  # SIGTERM, SIGINT (Ctrl-C), ...
    pod: PodFacts | None = None  # the sidecar's own pod, None outside Kubernetes or unreadable
    job: JobFacts | None = None  # its Job, None when unknown
    job_gone: bool = False  # the Job was not found: deleted


def decisive_cause(evidence: StopEvidence) -> Finding | None:
    """The cause, once the API shows one that needs no more waiting for; None until then."""
    job = evidence.job
    if job is not None and (failed := job_failure(job)) is not None:
        return _platform(Classification.JOB_FAILED, f"the Job failed, so this pod was stopped: {failed}")
    if evidence.job_gone or (job is not None and job.deleting):
        return _platform(Classification.JOB_DELETED, "the Job was deleted, and its pods with it")
    if job is not None and job.suspended:
        return _platform(
            Classification.JOB_SUSPENDED,
            "the Job was suspended (spec.suspend, as Kueue does): the attempt stopped, and the soak "
            "resumes on the same deadline when the Job is resumed",
        )
    condition = None if evidence.pod is None else evidence.pod.condition("DisruptionTarget")
    if condition is not None and condition.status == "True":
        reason = condition.reason or "unknown"
        kind, meaning = DISRUPTION_REASONS.get(
            reason, (Classification.NODE_DISRUPTION, "the pod was disrupted")
        )
        return _platform(kind, f"{meaning} ({reason}{_message(condition.message)})")
    return None


def cause_of_stop(evidence: StopEvidence) -> Finding:
    """The cause as far as it is known: decisive, else the pod's deletion, else the signal."""
    decided = decisive_cause(evidence)
    if decided is not None:
        return decided
    if evidence.pod is not None and evidence.pod.deleting:
        return _platform(
            Classification.POD_DELETED,
            "the pod was deleted (kubectl delete pod, or a controller) with no disruption recorded",
        )
    if evidence.signal is None:
        return Finding(Classification.EXTERNAL_CANCELLATION, INTERRUPTED_REASON, Source.SIDECAR)
    what = "Ctrl-C" if evidence.signal == "SIGINT" else evidence.signal
    reason = f"{INTERRUPTED_REASON}: the sidecar got {what}"
    return Finding(Classification.EXTERNAL_CANCELLATION, reason, Source.SIDECAR)


def _platform(kind: Classification, reason: str) -> Finding:
    return Finding(kind, reason, Source.PLATFORM)


def _message(message: str | None) -> str:
    return "" if not message else f": {sanitize(message, MESSAGE_CHARS)}"
