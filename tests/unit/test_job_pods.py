"""The attempts of a soak Job decided from hand-built pod, Event and Job facts (no apiserver)."""

from __future__ import annotations

import unicodedata
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from sidecar.commands.verdict import render_table
from sidecar.core.job_pods import (
    COMPLETION_INDEX_ANNOTATION,
    AttemptRow,
    attempt_rows,
    confirmed,
    end_condition,
    gone_rows,
    job_failure,
    job_rows,
    outcomes,
    run_goodput,
)
from sidecar.core.job_verdict import job_verdict
from sidecar.core.pod_facts import (
    ContainerFacts,
    ContainerState,
    EventFacts,
    JobCondition,
    JobFacts,
    PodFacts,
)
from sidecar.core.publication import (
    DEFAULT_PREFIX,
    Publication,
    build_annotations,
    termination_message,
)
from sidecar.core.running_annotations import build_evidence_annotations

SIDECAR = "soak-sidecar"
T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
FAILED = Publication(
    status="failed", classification="stale_progress", reason="no progress for 120 s", exit_code=12, attempt=1
)
PASSED = Publication(status="passed", classification=None, reason="", exit_code=0, attempt=2)


def published(pub: Publication) -> dict[str, str]:
    return {k: v for k, v in build_annotations(pub).items() if v is not None}


def ended(code: int, reason: str | None = None, message: str | None = None) -> ContainerState:
    return ContainerState("terminated", reason=reason, message=message, exit_code=code)


def waiting(reason: str | None, message: str | None = None) -> ContainerState:
    return ContainerState("waiting", reason=reason, message=message)


def sidecar(state: ContainerState | None, last: ContainerState | None = None) -> ContainerFacts:
    return ContainerFacts(SIDECAR, state=state, last_state=last)


def pod(name: str, *containers: ContainerFacts, minutes: int = 0, **fields: Any) -> PodFacts:
    """A running pod created ``minutes`` after T0, with ``fields`` of PodFacts set."""
    base = PodFacts(name=name, uid=f"uid-{name}", created=T0 + timedelta(minutes=minutes), phase="Running")
    return replace(base, containers=containers, **fields)


def exited(pub: Publication) -> ContainerFacts:
    """The sidecar as the kubelet records it after publishing ``pub``: exited with its code."""
    return sidecar(ended(pub.exit_code, "Completed" if pub.exit_code == 0 else "Error"))


def row(p: PodFacts) -> AttemptRow:
    (only,) = attempt_rows([p], prefix=DEFAULT_PREFIX, sidecar_container=SIDECAR)
    return only


def test_a_published_verdict_the_kubelet_confirms() -> None:
    got = row(pod("job-aaaaa", exited(PASSED), phase="Succeeded", annotations=published(PASSED)))
    assert (got.verdict, got.exit_code, got.sidecar_exit_code, got.source) == ("passed", 0, 0, "annotations")
    assert (got.attempt, got.phase, got.created) == (2, "Succeeded", T0.isoformat())
    assert got.passed


def test_the_termination_message_stands_in_for_missing_annotations() -> None:
    said = ended(12, "Error", termination_message(FAILED))
    got = row(pod("job-aaaaa", sidecar(said), phase="Failed"))
    assert (got.verdict, got.classification, got.source) == (
        "failed",
        "stale_progress",
        "termination-message",
    )
    assert got.reason == "no progress for 120 s" and not got.passed


def test_a_restarted_sidecar_is_judged_by_its_previous_run() -> None:
    restarted = sidecar(waiting("CrashLoopBackOff"), last=ended(12, "Error", termination_message(FAILED)))
    got = row(pod("job-aaaaa", restarted))
    assert (got.source, got.sidecar_exit_code) == ("termination-message", 12)


def test_a_pod_that_says_it_passed_against_the_kubelet_is_a_mismatch() -> None:
    got = row(pod("job-aaaaa", sidecar(ended(13, "Error")), annotations=published(PASSED)))
    assert got.verdict == "mismatch" and not got.passed
    assert got.reason == (
        "the pod's annotations say passed (exit 0) but the kubelet recorded exit 13 for soak-sidecar: "
        "not trusted"
    )


def test_a_pass_is_not_confirmed_while_the_sidecar_runs() -> None:
    got = row(pod("job-aaaaa", sidecar(ContainerState("running")), annotations=published(PASSED)))
    assert got.verdict == "passed" and not got.passed
    assert got.reason == "not confirmed yet: the kubelet has recorded no exit for soak-sidecar"


def test_confirmation_keeps_the_published_reason() -> None:
    assert confirmed(FAILED, None, SIDECAR, "unused") == (
        "failed",
        "no progress for 120 s; not confirmed yet: the kubelet has recorded no exit for soak-sidecar",
    )
    assert confirmed(FAILED, 12, SIDECAR, "unused") == ("failed", "no progress for 120 s")
    assert confirmed(None, None, SIDECAR, "still running") == (None, "still running")


@pytest.mark.parametrize(
    ("facts", "reason"),
    [
        (
            {"containers": (sidecar(ended(137, "OOMKilled")),)},
            "sidecar container terminated without a verdict (exit 137, OOMKilled)",
        ),
        (
            {"containers": (sidecar(ended(64, None, " soak-sidecar: error: bad settings\n")),)},
            "sidecar container terminated without a verdict (exit 64): soak-sidecar: error: bad settings",
        ),
        (
            {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
            "evicted: The node was low on resource: memory.",
        ),
        ({"phase": "Failed", "reason": "Evicted"}, "evicted"),
        ({"deleting": True}, "pod deleted before the sidecar published a verdict"),
        (
            {"phase": "Failed", "reason": "DeadlineExceeded", "message": "too long"},
            "pod failed without a verdict: DeadlineExceeded too long",
        ),
        ({"phase": "Succeeded"}, "pod succeeded without a verdict"),
        ({"phase": "Failed", "message": "gone"}, "pod failed without a verdict: gone"),
        (
            {
                "phase": "Pending",
                "init_containers": (ContainerFacts("install", waiting("ImagePullBackOff")),),
                "containers": (
                    ContainerFacts("trainer", waiting("ContainerCreating")),
                    sidecar(waiting("CreateContainerConfigError", 'secret "soak-s3" not found')),
                ),
            },
            'pending: install ImagePullBackOff; soak-sidecar CreateContainerConfigError (secret "soak-s3" '
            "not found)",
        ),
        (
            {"phase": "Pending", "containers": (sidecar(waiting("PodInitializing")),)},
            "pending: not running yet",
        ),
        ({"containers": (sidecar(waiting("CrashLoopBackOff")),)}, "sidecar waiting: CrashLoopBackOff"),
        ({"containers": (sidecar(waiting(None)),)}, "sidecar waiting: unknown"),
        ({"containers": (sidecar(ContainerState("running")),)}, "still running"),
        ({"phase": None}, "still running"),
    ],
)
def test_a_pod_without_a_verdict_says_why(facts: dict[str, Any], reason: str) -> None:
    got = row(replace(PodFacts(name="job-aaaaa", uid="u", phase="Running"), **facts))
    assert (got.verdict, got.source, got.reason) == (None, None, reason)
    assert not got.passed


def test_the_launchers_own_words_follow_the_reason() -> None:
    launcher = ContainerFacts("trainer", state=ended(1, "Error", "soak-launcher: heartbeat lost"))
    other = ContainerFacts("helper", state=ended(0, "Completed", "done"))
    got = row(pod("job-aaaaa", other, launcher, sidecar(ContainerState("running"))))
    assert got.reason == "still running; soak-launcher: heartbeat lost"


def test_phase_shows_a_pod_being_deleted_and_an_unknown_one() -> None:
    assert row(pod("job-aaaaa", deleting=True)).phase == "Running (deleting)"
    assert row(pod("job-aaaaa", phase=None)).phase == "Unknown"


def test_attempts_count_per_index_oldest_first_unless_published() -> None:
    def indexed(name: str, index: str, minutes: int, pub: Publication | None = None) -> PodFacts:
        verdict = published(pub) if pub is not None else {}
        return pod(name, minutes=minutes, annotations={COMPLETION_INDEX_ANNOTATION: index, **verdict})

    pods = [
        indexed("job-1-ccccc", "1", 2),
        indexed("job-0-bbbbb", "0", 5),
        indexed("job-1-aaaaa", "1", 1),
        indexed("job-0-ddddd", "0", 9, replace(FAILED, attempt=7)),
        pod("job-x-eeeee", annotations={COMPLETION_INDEX_ANNOTATION: "x"}),
    ]
    rows = attempt_rows(pods, prefix=DEFAULT_PREFIX, sidecar_container=SIDECAR)
    assert [(r.index, r.attempt, r.pod) for r in rows] == [
        (None, 1, "job-x-eeeee"),  # an unparsable index reads as none
        (0, 1, "job-0-bbbbb"),
        (0, 7, "job-0-ddddd"),
        (1, 1, "job-1-aaaaa"),
        (1, 2, "job-1-ccccc"),
    ]


def test_pods_created_at_once_or_never_stamped_sort_by_name() -> None:
    pods = [pod("job-bbbbb"), pod("job-aaaaa"), replace(pod("job-zzzzz"), created=None)]
    rows = attempt_rows(pods, prefix=DEFAULT_PREFIX, sidecar_container=SIDECAR)
    assert [(r.attempt, r.pod, r.created) for r in rows] == [
        (1, "job-zzzzz", None),
        (2, "job-aaaaa", T0.isoformat()),
        (3, "job-bbbbb", T0.isoformat()),
    ]


def test_no_column_carries_terminal_escapes() -> None:
    hostile = {
        **published(FAILED),
        f"{DEFAULT_PREFIX}verdict": "failed\x1b[2J",
        f"{DEFAULT_PREFIX}classification": "x\x1b]0;pwned\x07",
        f"{DEFAULT_PREFIX}artifact": "s3://b/\x9bk",
    }
    got = row(pod("job-aaaaa\x1b[1m", exited(FAILED), annotations=hostile))
    shown = "".join(str(value) for value in vars(got).values())
    assert not any(char in shown for char in "\x1b\x07\x9b"), shown


def test_the_verdict_table_shows_no_invisible_characters() -> None:
    smuggled = "".join(chr(0xE0000 + ord(c)) for c in "PASSED")  # tag characters: invisible text
    hidden = f"\u202e\u2066\u200b\u00ad\u2060{smuggled}"
    hostile = {
        **published(FAILED),
        f"{DEFAULT_PREFIX}verdict": f"failed{hidden}",
        f"{DEFAULT_PREFIX}classification": f"stale{hidden}",
        f"{DEFAULT_PREFIX}reason": f"no progress{hidden}",
        f"{DEFAULT_PREFIX}artifact": f"s3://b/{hidden}a",
    }
    gone = EventFacts(pod_name="job-bbbbb", pod_uid="uid-gone", annotations=hostile)
    rows = job_rows(
        [pod(f"job-aaaaa{hidden}", exited(FAILED), annotations=hostile)],
        [gone],
        job="job",
        prefix=DEFAULT_PREFIX,
        sidecar_container=SIDECAR,
    )
    table = render_table(rows)
    assert len(rows) == 2 and "no progress" in table
    assert not [char for char in table if unicodedata.category(char) == "Cf"], ascii(table)


def event(name: str | None, pub: Publication | None, uid: str | None = None) -> EventFacts:
    return EventFacts(pod_name=name, pod_uid=uid or f"uid-{name}", annotations=published(pub) if pub else {})


def test_pods_already_gone_keep_the_row_of_their_verdict_event() -> None:
    here = pod("job-aaaaa", exited(FAILED), annotations=published(FAILED))
    stopped = replace(FAILED, classification="job_failed", reason="the Job failed", index=0, indexes=2)
    events = [
        event("job-aaaaa", FAILED),  # its pod is still there: the pod's row is the one
        event("job-0-bbbbb", replace(stopped, reason="an earlier Event")),
        event("job-0-bbbbb", stopped),  # the last Event of a pod wins
        event("job-ccccc", replace(PASSED, attempt=None)),
        event("other-ddddd", FAILED),  # another Job's pod
        event("job-extra-eeeee", FAILED),  # not a name the Job controller gives
        event("job-fffff", None),  # no verdict annotations
        event(None, FAILED),  # about no pod
    ]
    rows = gone_rows(events, [here], job="job", prefix=DEFAULT_PREFIX)
    assert [(r.pod, r.index, r.attempt, r.phase, r.source) for r in rows] == [
        ("job-0-bbbbb", 0, 1, "Gone", "event"),
        ("job-ccccc", None, 1, "Gone", "event"),
    ]
    assert rows[0].reason == "the Job failed; the pod is gone: as its verdict Event records it"
    assert (rows[0].classification, rows[0].indexes, rows[0].created) == ("job_failed", 2, None)
    assert rows[1].verdict == "passed" and not rows[1].passed  # no kubelet record confirms it


def test_a_job_is_decided_on_its_pods_and_those_gone() -> None:
    index = {COMPLETION_INDEX_ANNOTATION: "1"}
    failed = replace(FAILED, index=1, indexes=2, attempt=1)
    pods = [pod("job-1-bbbbb", exited(failed), annotations={**index, **published(failed)})]
    gone = replace(PASSED, index=0, indexes=2, attempt=1)
    rows = job_rows(
        pods, [event("job-0-aaaaa", gone)], job="job", prefix=DEFAULT_PREFIX, sidecar_container=SIDECAR
    )
    assert [(r.index, r.pod) for r in rows] == [(0, "job-0-aaaaa"), (1, "job-1-bbbbb")]
    verdict = job_verdict(outcomes(rows), job_condition="Complete")
    assert not verdict.passed
    assert verdict.reason == "index 0 attempt 1 did not pass; index 1 attempt 1 did not pass"


def test_a_single_pod_soak_passes_on_its_confirmed_latest_attempt() -> None:
    pods = [
        pod("job-aaaaa", exited(FAILED), annotations=published(FAILED)),
        pod("job-bbbbb", exited(PASSED), minutes=5, annotations=published(PASSED)),
    ]
    rows = job_rows(pods, [], job="job", prefix=DEFAULT_PREFIX, sidecar_container=SIDECAR)
    assert [(r.attempt, r.passed) for r in rows] == [(1, False), (2, True)]
    assert job_verdict(outcomes(rows), job_condition=None).passed


def test_the_jobs_end_and_failure_from_its_conditions() -> None:
    running = JobFacts("job", (JobCondition("Suspended", "False"),))
    failing = JobFacts("job", (JobCondition("FailureTarget", "True", "BackoffLimitExceeded", "too many"),))
    failed = JobFacts("job", (JobCondition("Complete", "False"), JobCondition("Failed", "True")))
    complete = JobFacts("job", (JobCondition("Complete", "True"),))
    assert [end_condition(j) for j in (running, failing, failed, complete)] == [
        None,
        None,
        "Failed",
        "Complete",
    ]
    assert [job_failure(j) for j in (running, failing, failed, complete)] == [
        None,
        "BackoffLimitExceeded: too many",
        "Failed: no message",
        None,
    ]


EVIDENCE_URI = "s3://soaks/soak/ns/job/run/1-job-aaaaa/provisional-0002.json"


def test_a_pod_whose_sidecar_died_shows_its_evidence_and_how_far_it_goes() -> None:
    """The sidecar annotated where its provisional artifact is and when its evidence last reached
    the bucket; it was then SIGKILLed (exit 137) and never published a verdict."""
    annotations = build_evidence_annotations(EVIDENCE_URI, T0.timestamp() + 3600)
    got = row(pod("job-aaaaa", sidecar(ended(137, "Error")), annotations=annotations))
    assert got.verdict is None and not got.passed and got.artifact == EVIDENCE_URI
    assert got.reason.startswith(
        "attempt 1 ended without a verdict (last evidence at 2025-01-01T01:00:00Z): "
        "sidecar container terminated without a verdict (exit 137, Error)"
    ), got.reason


def test_a_running_pod_shows_its_evidence_so_far_and_a_verdict_wins_over_it() -> None:
    annotations = build_evidence_annotations(EVIDENCE_URI, T0.timestamp())
    running = row(pod("job-aaaaa", sidecar(ContainerState("running")), annotations=annotations))
    assert running.reason == "still running (last evidence at 2025-01-01T00:00:00Z)"
    assert running.artifact == EVIDENCE_URI
    done = row(pod("job-aaaaa", exited(FAILED), annotations={**annotations, **published(FAILED)}))
    assert done.verdict == "failed" and done.reason == FAILED.reason and done.artifact != EVIDENCE_URI


@pytest.mark.parametrize("at", ["", "soon", "-5", "9" * 12, "\u0663"])
def test_an_evidence_time_that_is_no_time_is_left_out(at: str) -> None:
    annotations = {**build_evidence_annotations(EVIDENCE_URI, 0.0), "soak.sidecar.io/evidence-at": at}
    got = row(pod("job-aaaaa", sidecar(ended(137, "Error")), annotations=annotations))
    assert got.reason.startswith("attempt 1 ended without a verdict: sidecar container"), got.reason


def test_the_runs_goodput_is_the_newest_attempt_that_tells_one() -> None:
    first = replace(FAILED, attempt=1, goodput=0.5, ledger_uri="s3://b/run/ledger.json")
    second = replace(PASSED, goodput=0.75, ledger_uri="s3://b/run/ledger.json")
    rows = [
        row(pod("job-aaaaa", exited(first), phase="Failed", annotations=published(first))),
        row(pod("job-bbbbb", exited(second), minutes=5, phase="Succeeded", annotations=published(second))),
        row(pod("job-ccccc", exited(PASSED), minutes=9, phase="Succeeded", annotations=published(PASSED))),
    ]
    found = run_goodput(rows)
    assert found is not None and found[0] == 0.75 and found[1].pod == "job-bbbbb"
    assert found[1].ledger == "s3://b/run/ledger.json"
    assert run_goodput(rows[2:]) is None
