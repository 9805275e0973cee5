"""The post-run rules, as the pure conclusion the supervisor calls with the run's facts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.classification import Classification, Finding, Source
from sidecar.core.conclusion import DeadlineSeen, RunFacts, SidecarHeartbeat, conclude, deadline_end
from sidecar.core.run_summary import SummaryOutcome, evaluate_run_summary
from sidecar.core.samples import ProcessInfo
from sidecar.launcher.protocol.exit import ExitRecord, KilledProcess, MemoryReport, OomKill
from sidecar.launcher.protocol.names import DEADLINE_SOFT_STOP

DATA = Path(__file__).resolve().parents[1] / "data" / "run_summary"
LAUNCHER = 10


def summary_of(raw: bytes | None) -> SummaryOutcome:
    return evaluate_run_summary(
        raw, mtime=None, run_started_wall=None, max_bytes=1 << 20, manifest_validator=None
    )


def completed_summary() -> SummaryOutcome:
    return summary_of((DATA / "minimal_completed.json").read_bytes())


def missing_summary() -> SummaryOutcome:
    return summary_of(None)


def process(pid: int, command: str = "python3 worker.py") -> ProcessInfo:
    return ProcessInfo(
        pid=pid,
        ppid=1,
        start_time=1.0,
        start_ticks=pid * 100,
        rss_kib=1,
        fd_count=3,
        fd_classes={},
        threads=1,
        state="sleeping",
        command=command,
    )


def exited(**fields: Any) -> ExitRecord:
    values: dict[str, Any] = {"launch_id": "a" * 32, "exit_code": 0, "reason": "exited", "trainer_pid": 11}
    values["returncode"] = 0
    return ExitRecord(**{**values, **fields})


def facts(**fields: Any) -> RunFacts:
    values: dict[str, Any] = {
        "monitor_failure": None,
        "gpu_fault": None,
        "exit_record": exited(),
        "trainer_program": "python3",
        "duration_s": 60.0,
        "min_duration_s": 0.0,
        "launcher_pid": LAUNCHER,
        "last_seen": (process(LAUNCHER, "launcher"), process(11, "trainer")),
        "still_alive": (),
        "summary": completed_summary(),
        "leaks": (),
        "deadline": DeadlineSeen(),
    }
    values.update(fields)
    failure = values["monitor_failure"]
    if isinstance(failure, tuple):  # the monitor's (kind, reason), as its check emits it
        values["monitor_failure"] = Finding(Classification(failure[0]), failure[1], Source.SIDECAR)
    return RunFacts(**values)


def test_a_clean_run_passes() -> None:
    result = conclude(facts())
    assert result.verdict.status == "passed" and result.residual_pids == ()


def test_a_launcher_that_wrote_no_exit_record_is_a_monitor_failure() -> None:
    result = conclude(facts(exit_record=None))
    assert result.verdict.classification == "monitor_failure"
    assert "launcher exited without writing exit.json" in (result.verdict.reason or "")


def test_a_trainer_that_could_not_start_says_why() -> None:
    missing = conclude(facts(exit_record=exited(reason="spawn_failed", exit_code=127, returncode=None)))
    assert missing.verdict.classification == "trainer_not_started"
    assert "'python3' was not found (launcher exit 127)" in (missing.verdict.reason or "")
    denied = conclude(facts(exit_record=exited(reason="spawn_failed", exit_code=126, returncode=None)))
    assert "is not executable" in (denied.verdict.reason or "")


def test_a_monitor_failure_comes_before_what_the_exit_record_says() -> None:
    failure = ("timeout/stale_tick", "training progress did not change for 31.0s")
    result = conclude(facts(monitor_failure=failure, exit_record=None))
    assert result.verdict.classification == "timeout/stale_tick"


def test_residuals_are_the_survivors_and_what_the_launcher_had_to_kill_never_the_launcher() -> None:
    record = exited(survivors_killed=(KilledProcess(pid=21, command=("daemon",)),), unreaped=(22, LAUNCHER))
    seen = (process(20), process(21))
    result = conclude(facts(exit_record=record, still_alive=(process(20),), last_seen=seen))
    assert result.residual_pids == (20, 21, 22)
    assert result.verdict.classification == "resource_leak"
    assert "residual child processes after shutdown: 20, 21, 22" in (result.verdict.reason or "")
    # Every residual PID is listed, however it ended; the launcher's own list names a process no
    # sample saw (it came and went between samples), so a leak verdict never shows an empty list.
    reported = [(p.pid, p.fate, p.last_seen is not None) for p in result.residuals_reported]
    assert reported == [
        (20, "alive_after_shutdown", True),
        (21, "killed_by_launcher", True),
        (22, "unreaped", False),
    ]
    assert result.residuals_reported[1].command == "daemon"


def test_a_helper_killed_between_samples_is_still_listed() -> None:
    record = exited(survivors_killed=(KilledProcess(pid=30, command=("python3", "helper.py")),))
    result = conclude(facts(exit_record=record))
    assert result.verdict.classification == "resource_leak"
    (only,) = result.residuals_reported
    assert (only.pid, only.command, only.fate) == (30, "python3 helper.py", "killed_by_launcher")
    assert only.last_seen is None


PASSED = DeadlineSeen(passed=True, term_due=True, margin_due=True)
TERM_DUE = DeadlineSeen(term_due=True, margin_due=True)
MARGIN_DUE = DeadlineSeen(margin_due=True)


def test_deadline_expired_by_the_launcher_by_the_clock_or_spent_at_the_margin() -> None:
    summary, missing = completed_summary(), missing_summary()
    assert deadline_end(exited(deadline_expired=True), summary, seen=PASSED) == "expired"
    # The deadline's TERM killed the trainer before the deadline itself passed.
    assert deadline_end(exited(reason="deadline", returncode=-15), summary, seen=TERM_DUE) == "expired"
    # A trainer that completed as the deadline passed did complete.
    assert deadline_end(exited(reason="exited", returncode=0), summary, seen=PASSED) is None
    assert deadline_end(None, summary, seen=PASSED) == "expired"
    # Stopped at the checkpoint margin without completing: the budget was spent, the deadline had
    # not expired.
    spent = exited(soft_stop_sent=True, returncode=0)
    assert deadline_end(spent, missing, seen=MARGIN_DUE) == "budget_spent"
    assert deadline_end(spent, summary, seen=MARGIN_DUE) is None
    margin = exited(soft_stop_sent=True, soft_stop_reason=DEADLINE_SOFT_STOP, returncode=0)
    assert deadline_end(margin, missing, seen=MARGIN_DUE) == "budget_spent"
    # Soft-stopped because the soak was stopped from outside: a cancellation, not the deadline.
    for reason in ("signal: SIGTERM", "control: soak was interrupted before the trainer completed"):
        stopped = exited(soft_stop_sent=True, soft_stop_reason=reason, returncode=0)
        assert deadline_end(stopped, missing, seen=MARGIN_DUE) is None


def test_the_deadline_claims_of_a_record_count_only_when_the_sidecars_clock_agrees() -> None:
    """A plain crash dressed as the deadline's (a planted exit.json) keeps its own class."""
    missing, early = missing_summary(), DeadlineSeen()
    assert deadline_end(exited(returncode=1, deadline_expired=True), missing, seen=early) is None
    assert deadline_end(exited(reason="deadline", returncode=1), missing, seen=early) is None
    assert deadline_end(exited(returncode=1, soft_stop_sent=True), missing, seen=early) is None


def test_a_trainer_that_ran_past_the_deadline_exhausted_it_whatever_it_exits_with() -> None:
    """SIGSTOP the launcher before the margin, train on past the deadline, exit 0: the sidecar saw
    the launcher still running after the deadline."""
    outlived = DeadlineSeen(passed=True, term_due=True, margin_due=True, outlived=True)
    assert deadline_end(exited(returncode=0), completed_summary(), seen=outlived) == "expired"
    verdict = conclude(facts(exit_record=exited(returncode=0), deadline=outlived)).verdict
    assert (verdict.classification, int(verdict.exit_code)) == ("deadline_exhausted", 14)


def test_the_sidecars_own_kill_is_named_and_never_passes() -> None:
    why = "the launcher did not stop the trainer within 15 s: the sidecar killed its processes itself"
    stalled = conclude(facts(monitor_failure=("timeout/stale_tick", "stale"), fallback_kill=why)).verdict
    assert stalled.classification == "timeout/stale_tick" and (stalled.reason or "").endswith(why)
    clean = conclude(facts(exit_record=exited(returncode=0), fallback_kill=why)).verdict
    assert (clean.status, clean.reason) == ("failed", why)


def test_a_clean_soft_stop_at_the_margin_does_not_say_the_deadline_expired() -> None:
    margin = exited(soft_stop_sent=True, soft_stop_reason=DEADLINE_SOFT_STOP, returncode=0)
    verdict = conclude(facts(exit_record=margin, summary=missing_summary(), deadline=MARGIN_DUE)).verdict
    assert verdict.classification == "deadline_exhausted" and verdict.reason is not None
    assert verdict.reason.startswith("the budget ran out") and "expired" not in verdict.reason


def test_the_deadline_is_the_verdict_even_over_a_monitor_failure() -> None:
    result = conclude(
        facts(
            exit_record=exited(deadline_expired=True, returncode=-9),
            monitor_failure=("monitor_failure", "lock lost"),
            deadline=PASSED,
        )
    )
    assert result.verdict.classification == "deadline_exhausted"


def test_a_signalled_trainer_reports_the_negative_signal() -> None:
    record = exited(returncode=None, signal=11)
    assert record.trainer_returncode == -11
    result = conclude(facts(exit_record=record))
    assert result.verdict.classification is not None
    assert "returncode -11" in (result.verdict.reason or "")
    assert replace(record, trainer_pid=None).trainer_returncode is None  # never started


def test_the_facts_are_all_it_needs() -> None:
    # Same facts, same conclusion: nothing else (clock, files) is consulted.
    first, second = conclude(facts(still_alive=(process(20),))), conclude(facts(still_alive=(process(20),)))
    assert first == second
    assert json.dumps(first.residual_pids) == "[20]"


def test_a_lost_heartbeat_is_the_sidecars_stall_not_the_trainers_failure() -> None:
    record = exited(reason="heartbeat_lost", returncode=None, signal=9, heartbeat_lost=True)
    stalled_sidecar = SidecarHeartbeat(longest_gap_s=31.0, timeout_s=30.0)
    result = conclude(facts(exit_record=record, summary=missing_summary(), heartbeat=stalled_sidecar))
    assert result.verdict.classification == "supervisor_lost"
    assert result.verdict.exit_code.retryable and int(result.verdict.exit_code) == 152
    assert (result.verdict.reason or "").startswith("the launcher lost the sidecar's heartbeat")
    # the sidecar's own finding comes first: the stall it saw before it stopped
    stalled = conclude(facts(exit_record=record, monitor_failure=("timeout/stale_tick", "stale")))
    assert stalled.verdict.classification == "timeout/stale_tick"


@pytest.mark.parametrize(
    "heartbeat",
    [SidecarHeartbeat(longest_gap_s=1.0, timeout_s=30.0), SidecarHeartbeat()],
    ids=["on time", "no record of a gap"],
)
def test_a_lost_heartbeat_the_sidecar_kept_writing_is_the_trainers_doing(heartbeat: SidecarHeartbeat) -> None:
    """SIGSTOP the launcher past the timeout, or delete the heartbeat file: the launcher reports the
    sidecar lost while the sidecar wrote on time. Never the retryable 152."""
    record = exited(reason="heartbeat_lost", returncode=None, signal=9, heartbeat_lost=True)
    result = conclude(facts(exit_record=record, summary=missing_summary(), heartbeat=heartbeat))
    assert (result.verdict.classification, int(result.verdict.exit_code)) == ("trainer_failure", 10)
    assert "the sidecar was there throughout" in (result.verdict.reason or "")
    owner = exited(returncode=1, owner_lost=True)
    assert not conclude(facts(exit_record=owner, heartbeat=heartbeat)).verdict.exit_code.retryable
    resumed = SidecarHeartbeat(longest_gap_s=1.0, timeout_s=30.0, resumed=True)
    again = conclude(facts(exit_record=record, summary=missing_summary(), heartbeat=resumed))
    assert again.verdict.classification == "supervisor_lost"  # the sidecar before this one was gone


STOPPED = (
    "the launcher (pid 10) was seen stopped 4.0 s into the attempt: stopped or traced from the trainer's side"
)


def test_a_launcher_seen_stopped_never_passes_and_is_never_a_lost_sidecar() -> None:
    clean = conclude(facts(launcher_stopped=STOPPED)).verdict
    assert (clean.classification, int(clean.exit_code), clean.reason) == ("trainer_failure", 10, STOPPED)
    # Stopped past the heartbeat timeout, a lapse the sidecar's clock cannot tell from its own stall.
    lost = exited(reason="heartbeat_lost", returncode=None, signal=9, heartbeat_lost=True)
    lapsed = SidecarHeartbeat(longest_gap_s=31.0, timeout_s=30.0)
    verdict = conclude(facts(exit_record=lost, heartbeat=lapsed, launcher_stopped=STOPPED)).verdict
    assert (verdict.classification, int(verdict.exit_code)) == ("trainer_failure", 10)
    assert (verdict.reason or "").endswith(STOPPED)
    crashed = conclude(facts(exit_record=exited(returncode=3, exit_code=3), launcher_stopped=STOPPED)).verdict
    assert crashed.classification == "trainer_failure" and (crashed.reason or "").endswith(STOPPED)


def memory(*victims: OomKill, start: int = 2, end: int = 3, limit: int | None = 192 * 2**20) -> MemoryReport:
    return MemoryReport("v1", limit, oom_kills_at_start=start, oom_kills_at_end=end, oom_killed=victims)


def test_a_trainer_killed_by_the_oom_killer_is_named_with_its_limit_and_peak() -> None:
    record = exited(
        returncode=None, signal=9, exit_code=137, memory=memory(OomKill(11, ("python3", "grow.py")))
    )
    result = conclude(facts(exit_record=record, summary=missing_summary(), peak_rss_kib=190 * 1024))
    assert (result.verdict.classification, result.verdict.exit_code) == ("out_of_memory", 20)
    assert result.verdict.reason == (
        "out of memory: the kernel's OOM killer killed the trainer (pid 11: python3 grow.py) at its "
        "memory limit of 192.0 MiB; peak RSS sampled 190.0 MiB; trainer did not write run_summary.json"
    )


def test_a_worker_the_launcher_did_not_reap_is_counted_not_named() -> None:
    """torchrun reaps its own OOM-killed rank and exits 1: the counter rose, no victim is named."""
    record = exited(returncode=1, exit_code=1, memory=memory(limit=None))
    reason = conclude(facts(exit_record=record)).verdict.reason
    assert reason == (
        "out of memory: the kernel's OOM killer killed 1 process in the trainer's cgroup "
        "(no memory limit was set)"
    )


def test_no_oom_kill_during_the_run_is_no_oom() -> None:
    record = exited(returncode=None, signal=9, exit_code=137, memory=memory(end=2))
    assert conclude(facts(exit_record=record)).verdict.classification == "trainer_failure"


def test_the_kubelets_oomkilled_explains_a_launcher_that_left_no_record() -> None:
    result = conclude(facts(exit_record=None, summary=missing_summary(), container_oom_killed=True))
    assert result.verdict.classification == "out_of_memory"
    assert (result.verdict.reason or "").startswith(
        "out of memory: the kernel's OOM killer killed the trainer's container "
        "(the kubelet reports it OOMKilled)"
    )


def test_a_storm_of_survivors_is_counted_whole_but_named_within_bounds() -> None:
    survivors = tuple(process(1000 + n) for n in range(300))
    result = conclude(facts(last_seen=(process(LAUNCHER, "launcher"), *survivors), still_alive=survivors))
    assert len(result.residual_pids) == 300
    assert len(result.residuals_reported) == 64
    reason = result.verdict.reason or ""
    assert result.verdict.classification == "resource_leak" and reason.endswith(" and 284 more")
    assert reason.count(", ") == 15
