"""Every classification a verdict can carry, and one table of what each means. Pure.

``Classification`` holds the wire strings (the artifact's ``failure_classification``, the pod
annotations). ``RULES`` gives, per classification: its exit code; its rank (the README's order of
causes: the lower rank names the first real cause, ``sidecar.core.verdict.judge`` applies it);
whether the trainer may claim it in its run_summary's shutdown record, and then what the sidecar
must have seen for the claim to count; whether the sidecar observed it (no claim replaces it); and
its description. Each ``Finding`` says who established it (``Source``): the sidecar's observation,
the platform, the launcher's record, the run_summary contract, or the trainer's claim. The README's
exit-code table, ``soak-sidecar exit-codes`` and the chart's podFailurePolicy lists are generated
from it and from ``ExitCode``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from sidecar.core.exitcodes import ExitCode


class Classification(str, Enum):
    """A verdict's classification; its value is the wire string."""

    DEADLINE_EXHAUSTED = "deadline_exhausted"
    GPU_FAULT = "gpu_fault"
    STARTUP_TIMEOUT = "timeout/startup"
    STALE_PROGRESS = "timeout/stale_tick"
    THROUGHPUT_DROPPED = "throughput_dropped"
    EXTERNAL_CANCELLATION = "external_cancellation"
    JOB_FAILED = "job_failed"
    JOB_SUSPENDED = "job_suspended"
    JOB_DELETED = "job_deleted"
    EVICTED = "evicted"
    PREEMPTED = "preempted"
    NODE_DISRUPTION = "node_disruption"
    POD_DELETED = "pod_deleted"
    MONITOR_FAILURE = "monitor_failure"
    LAUNCHER_MISSING = "launcher_missing"
    TRAINER_NOT_STARTED = "trainer_not_started"
    SUPERVISOR_LOST = "supervisor_lost"
    OUT_OF_MEMORY = "out_of_memory"
    TRAINER_FAILURE = "trainer_failure"
    LEARNER_FAILURE = "learner_failure"
    COLLECTOR_FAILURE = "collector_failure"
    BACKEND_WORKER_FAILURE = "backend_worker_failure"
    UNKNOWN_FAILURE = "unknown_failure"
    RESOURCE_LEAK = "resource_leak"
    MISSING_RUN_SUMMARY = "missing_run_summary"
    INVALID_RUN_SUMMARY = "invalid_run_summary"
    STALE_RUN_SUMMARY = "stale_run_summary"
    SCHEMA_VIOLATION = "schema_violation"
    SHUTDOWN_CONTRACT_VIOLATION = "shutdown_contract_violation"
    EVIDENCE_LOST = "evidence_lost"
    REFUSED = "refused"
    INSUFFICIENT_BUDGET = "insufficient_budget"
    TRANSIENT_INFRA = "transient_infra"

    def __str__(self) -> str:
        return self.value


class Source(Enum):
    """Who establishes a finding: what the verdict weighs."""

    SIDECAR = "the sidecar's own observation"
    PLATFORM = "the platform (the kubelet, the Job controller, the API)"
    LAUNCHER = "the launcher's record (the trainer's UID can disturb it: confirmed or refused)"
    CONTRACT = "the run_summary contract, checked by the sidecar"
    TRAINER = "the trainer's claim in its run_summary"


class Standing(Enum):
    """Where a finding stands in the verdict."""

    # A cause: in rank order, the first names the class (see sidecar.core.verdict.judge).
    CAUSE = "cause"
    # Named after the causes; the class only when nothing else failed (the sidecar's own kill).
    AFTER = "after"
    # Named only in a failure's reason; fails nothing by itself (XIDs the trainer caused).
    NOTE = "note"


@dataclass(frozen=True)
class Finding:
    """What one check found: its class, the reason in words, and who established it."""

    kind: Classification
    reason: str
    source: Source
    # The check could not name the cause (an unknown exit status, a trainer that ended too soon,
    # a run_summary check without a class of its own): the run_summary's class, any, takes its place.
    provisional: bool = False
    standing: Standing = Standing.CAUSE

    @property
    def rank(self) -> int:
        return RULES[self.kind].rank


@dataclass(frozen=True)
class Rule:
    exit_code: ExitCode
    rank: int
    description: str
    # The trainer may name it in its run_summary's shutdown record ...
    claimable: bool = False
    # ... and the claim counts only when the sidecar itself saw one of these (a cause only it sees).
    seen_as: frozenset[Classification] = frozenset()
    # What the sidecar observed or measured: a trainer's claim never replaces it.
    observed: bool = False


C = Classification
STOPPED_FROM_OUTSIDE = frozenset(
    {
        C.EXTERNAL_CANCELLATION,
        C.JOB_FAILED,
        C.JOB_SUSPENDED,
        C.JOB_DELETED,
        C.EVICTED,
        C.PREEMPTED,
        C.NODE_DISRUPTION,
        C.POD_DELETED,
    }
)
STALLED = frozenset({C.STALE_PROGRESS, C.STARTUP_TIMEOUT})
# What the monitor may end a run with, before the trainer's outcome is judged.
MONITOR_KINDS = (
    STALLED
    | STOPPED_FROM_OUTSIDE
    | {
        C.MONITOR_FAILURE,
        C.LAUNCHER_MISSING,
        C.TRAINER_NOT_STARTED,
        C.SUPERVISOR_LOST,
        C.THROUGHPUT_DROPPED,
        # the sidecar's own record shows the trainer at fault (it stopped or starved its launcher)
        C.TRAINER_FAILURE,
    }
)
# Refusals before the trainer starts.
PRE_START_KINDS = frozenset({C.REFUSED, C.INSUFFICIENT_BUDGET, C.TRANSIENT_INFRA})


def _cancel(description: str, exit_code: ExitCode = ExitCode.CANCELLED) -> Rule:
    return Rule(exit_code, 3, description, observed=True)


def _claim(description: str) -> Rule:
    return Rule(ExitCode.TRAINER_FAILED, 4, description, claimable=True)


def _contract(description: str) -> Rule:
    return Rule(ExitCode.CONTRACT_VIOLATION, 6, description)


RULES: Mapping[Classification, Rule] = MappingProxyType(
    {
        C.DEADLINE_EXHAUSTED: Rule(
            ExitCode.DEADLINE_EXHAUSTED,
            1,
            "the deadline ran out: its stop explains the rest",
            observed=True,
        ),
        C.GPU_FAULT: Rule(ExitCode.GPU_FAULT, 2, "a GPU was lost or needs a reset", observed=True),
        C.STARTUP_TIMEOUT: Rule(ExitCode.STALLED, 3, "no progress before the startup timeout", observed=True),
        C.STALE_PROGRESS: Rule(
            ExitCode.STALLED,
            3,
            "progress went stale",
            claimable=True,
            seen_as=STALLED,
            observed=True,
        ),
        C.THROUGHPUT_DROPPED: Rule(
            ExitCode.THROUGHPUT_DROPPED,
            3,
            "the step time grew past monitor.max_throughput_drop_pct",
            observed=True,
        ),
        C.EXTERNAL_CANCELLATION: Rule(
            ExitCode.CANCELLED,
            3,
            "a stop signal to the sidecar with no other cause known (Ctrl-C, SIGTERM, ...)",
            claimable=True,
            seen_as=STOPPED_FROM_OUTSIDE,
            observed=True,
        ),
        C.JOB_FAILED: _cancel("the Job failed in another index"),
        C.JOB_SUSPENDED: _cancel(
            "the Job was suspended: no failure, the soak resumes on the same deadline", ExitCode.JOB_SUSPENDED
        ),
        C.JOB_DELETED: _cancel("the Job was deleted"),
        C.EVICTED: _cancel("the pod was evicted (a drain)"),
        C.PREEMPTED: _cancel("the pod was preempted"),
        C.NODE_DISRUPTION: _cancel("the node was disrupted"),
        C.POD_DELETED: _cancel("the pod was deleted"),
        C.MONITOR_FAILURE: Rule(ExitCode.INTERNAL, 3, "the sidecar failed: a lost lock, a bug"),
        C.LAUNCHER_MISSING: Rule(ExitCode.TRAINER_NOT_STARTED, 3, "no launcher appeared"),
        C.TRAINER_NOT_STARTED: Rule(
            ExitCode.TRAINER_NOT_STARTED, 3, "the trainer command could not be started"
        ),
        C.SUPERVISOR_LOST: Rule(ExitCode.SUPERVISOR_LOST, 3, "the launcher lost the sidecar's heartbeat"),
        C.OUT_OF_MEMORY: Rule(
            ExitCode.OUT_OF_MEMORY,
            4,
            "the OOM killer killed a process of the trainer's, which failed",
            observed=True,
        ),
        C.TRAINER_FAILURE: Rule(
            ExitCode.TRAINER_FAILED, 4, "the trainer exited non-zero or died of a signal"
        ),
        C.LEARNER_FAILURE: _claim("the trainer says its learner failed"),
        C.COLLECTOR_FAILURE: _claim("the trainer says its collector failed"),
        C.BACKEND_WORKER_FAILURE: _claim("the trainer says a backend worker failed"),
        C.UNKNOWN_FAILURE: _claim("a failure with no class of its own"),
        C.RESOURCE_LEAK: Rule(
            ExitCode.RESOURCE_LEAK,
            5,
            "survivors of the trainer, or a leak",
            observed=True,
        ),
        C.MISSING_RUN_SUMMARY: _contract("no run_summary.json"),
        C.INVALID_RUN_SUMMARY: _contract("run_summary.json is not valid JSON or not an object"),
        C.STALE_RUN_SUMMARY: _contract("run_summary.json predates the attempt"),
        C.SCHEMA_VIOLATION: _contract("run_summary.json breaks its schema"),
        C.SHUTDOWN_CONTRACT_VIOLATION: _contract("run_summary.json breaks the shutdown contract"),
        C.EVIDENCE_LOST: Rule(ExitCode.EVIDENCE_LOST, 7, "the soak passed but its artifact was not uploaded"),
        C.REFUSED: Rule(ExitCode.REFUSED, 0, "refused before the trainer started"),
        C.INSUFFICIENT_BUDGET: Rule(
            ExitCode.INSUFFICIENT_BUDGET, 0, "less than the checkpoint margin was left"
        ),
        C.TRANSIENT_INFRA: Rule(
            ExitCode.TRANSIENT_INFRA,
            0,
            "the store or API was unreachable at the start",
        ),
    }
)

# What the sidecar observed or measured: the trainer's own classification never replaces them.
OBSERVED: frozenset[Classification] = frozenset(c for c, rule in RULES.items() if rule.observed)
# Shutdown classes that name a cause only the sidecar can see, and the kinds that show it saw it.
SEEN_ONLY: Mapping[str, frozenset[Classification]] = MappingProxyType(
    {c: rule.seen_as for c, rule in RULES.items() if rule.seen_as}
)
CLASSIFICATION_EXIT_CODES: Mapping[str, ExitCode] = MappingProxyType(
    {c: rule.exit_code for c, rule in RULES.items()}
)
ALL_CLASSIFICATIONS: tuple[Classification, ...] = tuple(RULES)


def classifications_for(code: ExitCode) -> list[str]:
    """The classifications that exit with ``code``, sorted by wire string."""
    return sorted(c.value for c, rule in RULES.items() if rule.exit_code is code)
