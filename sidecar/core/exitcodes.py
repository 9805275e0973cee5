"""The exit-code table: the one source of truth for the CLI, the docs and the Helm chart.

Kubeflow convention: 1-127 are permanent failures (the Job should fail), 128 and above are
retryable (the pod may be replaced). 128+N for small N is what a signalled process exits with,
so our own retryable codes sit at 150+ to stay distinguishable from "killed by signal N".
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    PASSED = 0
    TRAINER_FAILED = 10
    CONTRACT_VIOLATION = 11
    STALLED = 12
    RESOURCE_LEAK = 13
    DEADLINE_EXHAUSTED = 14
    REFUSED = 15
    EVIDENCE_LOST = 16
    CANCELLED = 17
    INSUFFICIENT_BUDGET = 18
    TRAINER_NOT_STARTED = 19
    OUT_OF_MEMORY = 20
    THROUGHPUT_DROPPED = 21
    USAGE = 64
    INTERNAL = 70
    GPU_FAULT = 150
    TRANSIENT_INFRA = 151
    SUPERVISOR_LOST = 152
    JOB_SUSPENDED = 153

    @property
    def retryable(self) -> bool:
        return self >= 128

    @property
    def failure(self) -> bool:
        """Whether the Job counts it as the pod's failure: a suspended Job's stop is none (the
        chart's podFailurePolicy ignores it, and the soak resumes on the same deadline)."""
        return self not in (ExitCode.PASSED, ExitCode.JOB_SUSPENDED)


EXIT_CODE_DESCRIPTIONS: dict[ExitCode, str] = {
    ExitCode.PASSED: "soak passed every check",
    ExitCode.TRAINER_FAILED: "trainer exited non-zero or died of a signal (a missing or abnormal "
    "run_summary is then supporting evidence), reported an abnormal shutdown, or failed a rule "
    "without a class of its own (e.g. min duration)",
    ExitCode.CONTRACT_VIOLATION: "run_summary.json missing, invalid, or violating its contract",
    ExitCode.STALLED: "no progress before the startup timeout, or progress went stale",
    ExitCode.RESOURCE_LEAK: "processes survived shutdown, or a resource leak check failed",
    ExitCode.DEADLINE_EXHAUSTED: "the persistent total-job deadline expired during the run",
    ExitCode.REFUSED: "identity/config mismatch, missing approval, corrupt record, or a second supervisor",
    ExitCode.EVIDENCE_LOST: "soak passed but the artifact could not be uploaded (local copy kept)",
    ExitCode.CANCELLED: "the soak was stopped from outside: an eviction (drain), a preemption, a node "
    "disruption, the Job failed elsewhere or deleted, the pod deleted, or a stop signal to the "
    "sidecar (Ctrl-C, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1/2); a suspended Job is 153",
    ExitCode.INSUFFICIENT_BUDGET: "less than the checkpoint margin was left: refused to start",
    ExitCode.TRAINER_NOT_STARTED: "the launcher never appeared, or the trainer command could not be "
    "started (not found, not executable)",
    ExitCode.OUT_OF_MEMORY: "the kernel's OOM killer killed the trainer or one of its processes at "
    "the trainer's memory limit, and the trainer failed",
    ExitCode.THROUGHPUT_DROPPED: "the trainer's throughput dropped more than --max-throughput-drop "
    "(percent an hour, or against the first hour; monitor.max_throughput_drop_pct): the sidecar "
    "stopped it",
    ExitCode.USAGE: "usage or configuration error",
    ExitCode.INTERNAL: "internal error of soak-sidecar (monitor failure)",
    ExitCode.GPU_FAULT: "a GPU was lost or needs a reset (retryable on another node)",
    ExitCode.TRANSIENT_INFRA: "transient infrastructure failure (store or API unreachable)",
    ExitCode.SUPERVISOR_LOST: "the launcher stopped the trainer because the sidecar's heartbeat was "
    "lost (the sidecar stalled or died; retryable)",
    ExitCode.JOB_SUSPENDED: "the Job was suspended (Kueue, spec.suspend): the attempt stopped, no failure; "
    "the chart's podFailurePolicy ignores it and the soak resumes on the same deadline",
}
