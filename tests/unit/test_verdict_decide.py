"""verdict.decide: the seed's precedence, the added deadline/GPU/evidence outcomes, exit codes."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.classification import (
    ALL_CLASSIFICATIONS,
    CLASSIFICATION_EXIT_CODES,
    MONITOR_KINDS,
    PRE_START_KINDS,
    Classification,
    Finding,
    Source,
)
from sidecar.core.exitcodes import ExitCode
from sidecar.core.gpu_health import gpu_fault as gpu_fault_finding
from sidecar.core.run_summary import (
    SHUTDOWN_CLASSIFICATIONS,
    SUMMARY_CLASSIFICATIONS,
    SummaryOutcome,
    evaluate_parsed,
    evaluate_run_summary,
)
from sidecar.core.verdict import (
    DEADLINE_REASON,
    Verdict,
    decide,
    exit_code_for,
    exit_code_table_markdown,
    refused,
    with_upload_error,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "run_summary"
COMPLETED: dict[str, Any] = json.loads((DATA / "minimal_completed.json").read_text())
ABNORMAL: dict[str, Any] = json.loads((DATA / "minimal_abnormal.json").read_text())
ABNORMAL_SHUTDOWN = (
    "shutdown classification='learner_failure', owner='learner', phase='train', "
    "exception='RuntimeError': 'CUDA error: an illegal memory access', cleanup_errors=0"
)


def outcome_of(document: dict[str, Any]) -> SummaryOutcome:
    return evaluate_parsed(copy.deepcopy(document), manifest_validator=None)


GOOD = outcome_of(COMPLETED)
MISSING = evaluate_run_summary(
    None, mtime=None, run_started_wall=None, max_bytes=1024, manifest_validator=None
)
LEARNER = outcome_of(ABNORMAL)


def run(**overrides: Any) -> Verdict:
    options: dict[str, Any] = {
        "monitor_failure": None,
        "returncode": 0,
        "duration_s": 100.0,
        "min_duration_s": 0.0,
        "residuals": (),
        "summary": GOOD,
        "deadline": None,
        "gpu_fault": None,
        "upload_error": None,
    }
    options.update(overrides)
    return facts_verdict(**options)


def facts_verdict(
    *,
    monitor_failure: tuple[str, str] | None,
    gpu_fault: str | None,
    out_of_memory: str | None = None,
    leaks: Sequence[str] = (),
    upload_error: str | None,
    **facts: Any,
) -> Verdict:
    """decide on the cases' plain values, as the checks emit them: the monitor's (kind, reason),
    the GPU rule's and the OOM record's text, the leak checks' messages; then the upload's error."""
    verdict = decide(
        monitor_failure=None
        if monitor_failure is None
        else Finding(Classification(monitor_failure[0]), monitor_failure[1], Source.SIDECAR),
        gpu_fault=None if gpu_fault is None else gpu_fault_finding(gpu_fault),
        out_of_memory=None
        if out_of_memory is None
        else Finding(Classification.OUT_OF_MEMORY, out_of_memory, Source.LAUNCHER),
        leaks=[Finding(Classification.RESOURCE_LEAK, leak, Source.SIDECAR) for leak in leaks],
        **facts,
    )
    return verdict if upload_error is None else with_upload_error(verdict, upload_error)


def test_clean_run_passes() -> None:
    assert run() == Verdict(status="passed", classification=None, reason=None, exit_code=ExitCode.PASSED)


# (case, overrides, classification, reason)
CASES: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "nonzero exit",
        {"returncode": 3},
        "trainer_failure",
        "trainer exited with returncode 3",
    ),
    (
        "killed by signal",
        {"returncode": -9},
        "trainer_failure",
        "trainer exited with returncode -9",
    ),
    (
        "unknown exit status fails closed",
        {"returncode": None},
        "unknown_failure",
        "trainer exit status is unknown",
    ),
    (
        "too short",
        {"duration_s": 5.0, "min_duration_s": 10.0},
        "trainer_failure",
        "the trainer finished after 5.0 s, before the soak's minimum duration (min_duration_seconds=10.0)",
    ),
    (
        "residuals",
        {"residuals": ["123", "456 (python worker.py)"]},
        "resource_leak",
        "residual child processes after shutdown: 123, 456 (python worker.py)",
    ),
    (
        "residuals only when nothing failed yet",
        {"returncode": 1, "residuals": ["123"]},
        "trainer_failure",
        "trainer exited with returncode 1",
    ),
    (
        "min duration hides residuals",
        {"duration_s": 1.0, "min_duration_s": 2.0, "residuals": ["9"]},
        "trainer_failure",
        "the trainer finished after 1.0 s, before the soak's minimum duration (min_duration_seconds=2.0)",
    ),
    (
        "missing summary",
        {"summary": MISSING},
        "missing_run_summary",
        "trainer did not write run_summary.json",
    ),
    (
        "a crash is the cause, the missing summary its evidence",
        {"returncode": 2, "summary": MISSING},
        "trainer_failure",
        "trainer exited with returncode 2; trainer did not write run_summary.json",
    ),
    (
        "residuals keep their kind over the summary's",
        {"residuals": ["7"], "summary": MISSING},
        "resource_leak",
        "residual child processes after shutdown: 7; trainer did not write run_summary.json",
    ),
    (
        "monitor stale tick",
        {
            "monitor_failure": (
                "timeout/stale_tick",
                "training progress did not change for 130.0s",
            ),
            "returncode": -15,
            "summary": MISSING,
        },
        "timeout/stale_tick",
        "training progress did not change for 130.0s; trainer did not write run_summary.json",
    ),
    (
        "startup timeout",
        {
            "monitor_failure": (
                "timeout/startup",
                "training produced no progress artifact within 600.0s",
            ),
            "returncode": -15,
            "summary": MISSING,
        },
        "timeout/startup",
        "training produced no progress artifact within 600.0s; trainer did not write run_summary.json",
    ),
    (
        "abnormal summary alone",
        {"returncode": 0, "summary": LEARNER},
        "learner_failure",
        f"run_summary status is 'failed', expected 'completed'; {ABNORMAL_SHUTDOWN}",
    ),
    (
        "status message only when nothing failed before",
        {"returncode": 1, "summary": LEARNER},
        "learner_failure",
        f"trainer exited with returncode 1; {ABNORMAL_SHUTDOWN}",
    ),
    (
        "a stop the sidecar saw stands over the trainer's own class (the seed let the trainer's win)",
        {
            "monitor_failure": ("external_cancellation", "soak was interrupted"),
            "returncode": -2,
            "summary": LEARNER,
        },
        "external_cancellation",
        f"soak was interrupted; {ABNORMAL_SHUTDOWN}",
    ),
    (
        "... and so do survivors the sidecar found",
        {"residuals": ["5"], "summary": LEARNER},
        "resource_leak",
        f"residual child processes after shutdown: 5; {ABNORMAL_SHUTDOWN}",
    ),
    (
        "the trainer's own class replaces a monitor kind that observed no cause (seed)",
        {"monitor_failure": ("supervisor_lost", "lost"), "returncode": None, "summary": LEARNER},
        "learner_failure",
        f"lost; {ABNORMAL_SHUTDOWN}",
    ),
    (
        "launcher missing",
        {
            "monitor_failure": ("launcher_missing", "launcher.json did not appear within 300.0s"),
            "returncode": None,
            "summary": MISSING,
        },
        "launcher_missing",
        "launcher.json did not appear within 300.0s; trainer did not write run_summary.json",
    ),
    (
        "monitor crash",
        {
            "monitor_failure": ("monitor_failure", "soak monitor failed: OSError: boom"),
            "returncode": -15,
        },
        "monitor_failure",
        "soak monitor failed: OSError: boom",
    ),
]


@pytest.mark.parametrize(("case", "overrides", "classification", "reason"), CASES, ids=[c[0] for c in CASES])
def test_seed_precedence(case: str, overrides: dict[str, Any], classification: str, reason: str) -> None:
    verdict = run(**overrides)
    assert verdict.status == "failed"
    assert verdict.classification == classification
    assert verdict.reason == reason
    assert verdict.exit_code == CLASSIFICATION_EXIT_CODES[classification]


def test_summary_kind_fills_an_empty_slot_after_a_kindless_failure() -> None:
    broken = copy.deepcopy(COMPLETED)
    broken["runtime_manifest"]["replay_ingress"]["dropped_batches"] = 1
    verdict = run(duration_s=1.0, min_duration_s=2.0, summary=outcome_of(broken))
    assert verdict.classification == "schema_violation"
    assert verdict.exit_code == ExitCode.CONTRACT_VIOLATION
    assert verdict.reason == (
        "the trainer finished after 1.0 s, before the soak's minimum duration "
        "(min_duration_seconds=2.0); "
        "replay_ingress early_returns and dropped_batches disagree: 0 != 1"
    )


def test_a_crash_keeps_its_class_over_a_broken_summary_that_names_none() -> None:
    broken = copy.deepcopy(COMPLETED)
    broken["runtime_manifest"]["replay_ingress"]["dropped_batches"] = 1
    verdict = run(returncode=1, summary=outcome_of(broken))
    assert (verdict.classification, verdict.exit_code) == ("trainer_failure", ExitCode.TRAINER_FAILED)
    assert verdict.reason == (
        "trainer exited with returncode 1; replay_ingress early_returns and dropped_batches disagree: 0 != 1"
    )


def test_a_crash_with_a_valid_abnormal_summary_takes_the_trainers_own_class() -> None:
    verdict = run(returncode=1, summary=LEARNER)
    assert (verdict.classification, verdict.exit_code) == ("learner_failure", ExitCode.TRAINER_FAILED)


def test_invalid_abnormal_shutdown_keeps_the_monitor_kind() -> None:
    broken = copy.deepcopy(ABNORMAL)
    broken["runtime_manifest"]["shutdown"]["owner"] = ""
    verdict = run(monitor_failure=("timeout/stale_tick", "stale"), returncode=-15, summary=outcome_of(broken))
    assert verdict.classification == "timeout/stale_tick"
    assert verdict.reason == "stale; shutdown has invalid owner ''"


def test_job_failed_stands_over_the_trainers_own_cancellation() -> None:
    """Soft-stopped because another index failed the Job, the trainer calls it a cancellation; the
    sidecar knows why (same exit code, a more precise name). So does any other class it claims: the
    failure came while it was being stopped."""
    cancelled = copy.deepcopy(ABNORMAL)
    cancelled["runtime_manifest"]["shutdown"]["classification"] = "external_cancellation"
    stopped = ("job_failed", "the Job failed, so this pod was stopped: PodFailurePolicy")
    verdict = run(monitor_failure=stopped, summary=outcome_of(cancelled))
    assert (verdict.classification, verdict.exit_code) == ("job_failed", ExitCode.CANCELLED)
    assert run(monitor_failure=stopped, summary=LEARNER).classification == "job_failed"
    plain = run(monitor_failure=("external_cancellation", "interrupted"), summary=outcome_of(cancelled))
    assert plain.classification == "external_cancellation"


@pytest.mark.parametrize("cause", ["evicted", "preempted", "node_disruption", "job_suspended", "pod_deleted"])
def test_a_named_cancellation_stands_over_the_trainers_own_cancellation(cause: str) -> None:
    cancelled = copy.deepcopy(ABNORMAL)
    cancelled["runtime_manifest"]["shutdown"]["classification"] = "external_cancellation"
    verdict = run(monitor_failure=(cause, "why"), returncode=0, summary=outcome_of(cancelled))
    expected = ExitCode.JOB_SUSPENDED if cause == "job_suspended" else ExitCode.CANCELLED
    assert (verdict.classification, verdict.exit_code) == (cause, expected)


def test_a_claimed_cancellation_without_a_stop_is_not_taken() -> None:
    """A crash whose summary says external_cancellation, though no stop was ever sent: the trainer's
    failure (10), not CANCELLED (17); the claim is named."""
    cancelled = copy.deepcopy(ABNORMAL)
    cancelled["runtime_manifest"]["shutdown"]["classification"] = "external_cancellation"
    verdict = run(returncode=3, summary=outcome_of(cancelled))
    assert (verdict.classification, verdict.exit_code) == ("trainer_failure", ExitCode.TRAINER_FAILED)
    assert verdict.reason is not None
    assert verdict.reason.endswith(
        "the trainer's run_summary claims 'external_cancellation', which the sidecar did not see"
    )
    # exit 0 with the same claim: still the trainer's failure
    assert run(returncode=0, summary=outcome_of(cancelled)).exit_code == ExitCode.TRAINER_FAILED


def test_a_claimed_stall_counts_only_when_the_sidecar_saw_one() -> None:
    stalled = copy.deepcopy(ABNORMAL)
    stalled["runtime_manifest"]["shutdown"]["classification"] = "timeout/stale_tick"
    assert run(returncode=1, summary=outcome_of(stalled)).exit_code == ExitCode.TRAINER_FAILED
    seen = run(monitor_failure=("timeout/stale_tick", "stale"), returncode=-15, summary=outcome_of(stalled))
    assert (seen.classification, seen.exit_code) == ("timeout/stale_tick", ExitCode.STALLED)


@pytest.mark.parametrize("claim", ["external_cancellation", "learner_failure", "unknown_failure"])
def test_what_the_sidecar_measured_outranks_what_the_trainer_claims(claim: str) -> None:
    """A stalled trainer, or a leaker, that writes a class of its own keeps the sidecar's."""
    summary = copy.deepcopy(ABNORMAL)
    summary["runtime_manifest"]["shutdown"]["classification"] = claim
    stalled = run(monitor_failure=("timeout/stale_tick", "stale"), returncode=1, summary=outcome_of(summary))
    assert stalled.exit_code == ExitCode.STALLED
    leaked = run(returncode=0, leaks=["RSS grew 80 MiB"], summary=outcome_of(summary))
    assert (leaked.classification, leaked.exit_code) == ("resource_leak", ExitCode.RESOURCE_LEAK)


OOM = "out of memory: the kernel's OOM killer killed the trainer (pid 7: python3 grow.py)"


def test_an_oom_killed_trainer_is_out_of_memory_over_its_own_summary() -> None:
    verdict = run(returncode=-9, summary=MISSING, out_of_memory=OOM)
    assert (verdict.classification, verdict.exit_code) == ("out_of_memory", ExitCode.OUT_OF_MEMORY)
    assert verdict.reason == f"{OOM}; trainer did not write run_summary.json"
    # a trainer that names its own failure does not hide the kernel's kill
    assert run(returncode=1, summary=LEARNER, out_of_memory=OOM).classification == "out_of_memory"
    # the launcher gone with the container: the kubelet's OOMKilled, no exit status
    assert run(returncode=None, summary=MISSING, out_of_memory=OOM).classification == "out_of_memory"


def test_an_oom_kill_the_trainer_survived_is_not_a_failure() -> None:
    """A worker OOM-killed and replaced, the trainer finished well: nothing to fail."""
    assert run(returncode=0, out_of_memory=OOM).status == "passed"


def test_a_stall_or_the_deadline_outranks_an_oom_kill() -> None:
    stalled = run(monitor_failure=("timeout/stale_tick", "stale"), returncode=-9, out_of_memory=OOM)
    assert stalled.classification == "timeout/stale_tick"
    assert run(returncode=-9, deadline="expired", out_of_memory=OOM).classification == "deadline_exhausted"


def test_deadline_outranks_the_kill_it_caused() -> None:
    cancelled = copy.deepcopy(ABNORMAL)
    cancelled["runtime_manifest"]["shutdown"]["classification"] = "external_cancellation"
    verdict = run(returncode=-9, deadline="expired", summary=outcome_of(cancelled))
    assert verdict.classification == "deadline_exhausted"
    assert verdict.exit_code == ExitCode.DEADLINE_EXHAUSTED
    assert verdict.reason is not None
    assert verdict.reason.startswith(f"{DEADLINE_REASON}; shutdown classification=")
    assert "trainer exited with returncode" not in verdict.reason

    verdict = run(returncode=-9, deadline="expired", summary=MISSING, residuals=["4"])
    assert verdict.reason == f"{DEADLINE_REASON}; trainer did not write run_summary.json"
    # a deadline reached even though the trainer then wrote a good summary still fails
    assert run(deadline="expired").classification == "deadline_exhausted"


def test_gpu_fault_is_retryable_and_outranks_the_trainer() -> None:
    verdict = run(returncode=1, gpu_fault="GPU 0 fell off the bus (Xid 79)", summary=LEARNER)
    assert verdict.classification == "gpu_fault"
    assert verdict.exit_code == ExitCode.GPU_FAULT and verdict.exit_code.retryable
    assert verdict.reason == f"GPU fault: GPU 0 fell off the bus (Xid 79); {ABNORMAL_SHUTDOWN}"
    both = run(returncode=-9, gpu_fault="lost", deadline="expired")
    assert both.classification == "deadline_exhausted"
    assert both.reason == f"{DEADLINE_REASON}; GPU fault: lost"


def test_upload_failure_only_fails_a_passing_soak() -> None:
    verdict = run(upload_error="PutObject: 503 SlowDown")
    assert verdict.status == "failed"
    assert verdict.classification == "evidence_lost"
    assert verdict.exit_code == ExitCode.EVIDENCE_LOST
    assert verdict.reason == "soak passed but its artifact was not uploaded: PutObject: 503 SlowDown"

    failed = run(returncode=1, upload_error="denied")
    assert failed.classification == "trainer_failure"
    assert failed.reason == "trainer exited with returncode 1"


def test_unknown_monitor_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown monitor failure kind 'gpu_fault'"):
        run(monitor_failure=("gpu_fault", "no"))


def test_refusals() -> None:
    verdict = refused("approval record does not match the run identity")
    assert verdict == Verdict(
        status="failed",
        classification=Classification.REFUSED,
        reason="approval record does not match the run identity",
        exit_code=ExitCode.REFUSED,
    )
    assert refused("3s left", classification=Classification.INSUFFICIENT_BUDGET).exit_code == (
        ExitCode.INSUFFICIENT_BUDGET
    )
    store_down = refused("deadline store unreachable", classification=Classification.TRANSIENT_INFRA)
    assert store_down.exit_code == ExitCode.TRANSIENT_INFRA and store_down.exit_code.retryable


# --- the exit-code table ------------------------------------------------------------------------

EXPECTED_TABLE = {
    "learner_failure": 10,
    "collector_failure": 10,
    "backend_worker_failure": 10,
    "unknown_failure": 10,
    "trainer_failure": 10,
    "missing_run_summary": 11,
    "invalid_run_summary": 11,
    "stale_run_summary": 11,
    "schema_violation": 11,
    "shutdown_contract_violation": 11,
    "timeout/startup": 12,
    "timeout/stale_tick": 12,
    "resource_leak": 13,
    "deadline_exhausted": 14,
    "refused": 15,
    "evidence_lost": 16,
    "external_cancellation": 17,
    "job_failed": 17,
    "job_suspended": 153,
    "job_deleted": 17,
    "evicted": 17,
    "preempted": 17,
    "node_disruption": 17,
    "pod_deleted": 17,
    "insufficient_budget": 18,
    "launcher_missing": 19,
    "trainer_not_started": 19,
    "out_of_memory": 20,
    "monitor_failure": 70,
    "gpu_fault": 150,
    "transient_infra": 151,
    "supervisor_lost": 152,
    "throughput_dropped": 21,
}


def test_exit_code_table() -> None:
    assert {name: int(code) for name, code in CLASSIFICATION_EXIT_CODES.items()} == EXPECTED_TABLE
    assert set(ALL_CLASSIFICATIONS) == set(EXPECTED_TABLE)
    assert len(ALL_CLASSIFICATIONS) == len(set(ALL_CLASSIFICATIONS))
    assert exit_code_for(None) == ExitCode.PASSED
    with pytest.raises(KeyError):
        exit_code_for("normal_completion")
    with pytest.raises(TypeError):
        CLASSIFICATION_EXIT_CODES["x"] = ExitCode.INTERNAL  # type: ignore[index]


def test_every_producible_classification_has_a_code() -> None:
    producible = (
        {c for c in SHUTDOWN_CLASSIFICATIONS if c != "normal_completion"}
        | set(SUMMARY_CLASSIFICATIONS)
        | set(MONITOR_KINDS)
        | set(PRE_START_KINDS)
        | {"resource_leak", "trainer_failure", "deadline_exhausted", "gpu_fault", "evidence_lost"}
        | {"out_of_memory"}
    )
    assert producible == set(ALL_CLASSIFICATIONS)
    # every failure code of the table is reachable; only usage errors come from elsewhere
    assert set(CLASSIFICATION_EXIT_CODES.values()) == set(ExitCode) - {
        ExitCode.PASSED,
        ExitCode.USAGE,
    }
    retryable = {name for name, code in CLASSIFICATION_EXIT_CODES.items() if code.retryable}
    assert retryable == {"gpu_fault", "transient_infra", "supervisor_lost", "job_suspended"}


SUMMARIES = [GOOD, MISSING, LEARNER, outcome_of({"status": "completed"}), outcome_of({})]


@settings(max_examples=500, deadline=None)
@given(
    monitor=st.none() | st.tuples(st.sampled_from(sorted(MONITOR_KINDS)), st.text(min_size=1, max_size=20)),
    returncode=st.none() | st.integers(-64, 255),
    duration=st.floats(0, 1e6),
    minimum=st.floats(0, 1e6),
    residuals=st.lists(st.text(min_size=1, max_size=8), max_size=3),
    summary=st.sampled_from(SUMMARIES),
    deadline=st.booleans(),
    gpu=st.none() | st.text(min_size=1, max_size=20),
    upload=st.none() | st.text(min_size=1, max_size=20),
)
def test_decide_is_total_and_consistent(
    *,
    monitor: tuple[Classification, str] | None,
    returncode: int | None,
    duration: float,
    minimum: float,
    residuals: list[str],
    summary: SummaryOutcome,
    deadline: bool,
    gpu: str | None,
    upload: str | None,
) -> None:
    verdict = facts_verdict(
        monitor_failure=monitor,
        returncode=returncode,
        duration_s=duration,
        min_duration_s=minimum,
        residuals=residuals,
        summary=summary,
        deadline="expired" if deadline else None,
        gpu_fault=gpu,
        upload_error=upload,
    )
    assert verdict.exit_code == exit_code_for(verdict.classification)
    assert (verdict.status == "passed") == (verdict.reason is None) == (verdict.classification is None)
    if verdict.status == "passed":
        assert summary.passed and returncode == 0 and not residuals
        assert monitor is None and not deadline and gpu is None and upload is None
    if deadline:
        assert verdict.classification == "deadline_exhausted"
    elif gpu is not None:
        assert verdict.classification == "gpu_fault"


def test_markdown_table_lists_every_code_and_classification_once() -> None:
    table = exit_code_table_markdown()
    lines = table.splitlines()
    assert lines[0] == "| code | name | retryable | meaning | classifications |"
    rows = [line.strip("| ").split(" | ") for line in lines[2:]]
    assert [int(row[0]) for row in rows] == [int(code) for code in ExitCode]
    listed = [name.strip("`") for row in rows for name in row[4].split(", ") if name != "-"]
    assert sorted(listed) == sorted(ALL_CLASSIFICATIONS)
    assert "| 150 | GPU_FAULT | yes | a GPU was lost or needs a reset" in table
    assert "(retryable on another node) | `gpu_fault` |" in table
    assert "| 0 | PASSED | no | soak passed every check | - |" in table


def test_leak_checks_report_like_residuals() -> None:
    leak = "eventfd count grew from 12 to 4096"
    verdict = run(leaks=[leak])
    assert (verdict.classification, verdict.reason) == ("resource_leak", leak)
    assert verdict.exit_code == ExitCode.RESOURCE_LEAK
    both = run(residuals=["8"], leaks=[leak], summary=MISSING)
    assert both.reason == (
        "residual child processes after shutdown: 8; trainer did not write run_summary.json"
    )
    assert run(returncode=1, leaks=[leak]).reason == "trainer exited with returncode 1"


def test_with_upload_error_after_the_fact() -> None:
    lost = with_upload_error(run(), "timeout")
    assert lost == run(upload_error="timeout")
    assert lost.classification == "evidence_lost"
    failed = run(returncode=1)
    assert with_upload_error(failed, "timeout") == run(returncode=1, upload_error="timeout")
    assert with_upload_error(failed, "timeout").classification == "trainer_failure"


@pytest.mark.parametrize("deadline", ["budget_spent", "expired"])
def test_a_trainer_the_deadline_stopped_may_say_it_was_stopped(deadline: str) -> None:
    """The margin's soft stop (or the deadline's TERM) is the sidecar's own stop: a summary that says
    external_cancellation is right, and the reason does not call it a claim the sidecar did not see."""
    cancelled = copy.deepcopy(ABNORMAL)
    cancelled["runtime_manifest"]["shutdown"]["classification"] = "external_cancellation"
    verdict = run(returncode=0, deadline=deadline, summary=outcome_of(cancelled))
    assert verdict.classification == "deadline_exhausted"
    assert "did not see" not in (verdict.reason or "")
