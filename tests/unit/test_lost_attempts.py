"""Which earlier attempts ended without a verdict, from what their evidence locations hold (pure):
a provisional record of the same run and index, numbered below the current attempt, and no final
artifact beside it. Whatever else a location holds (the bucket and the output dir are shared) is
left out, never an error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sidecar.core.artifact.lost import PROVISIONAL_LIMIT_BYTES, FoundAttempt, describe_lost, lost_attempts

RUN = "7c9e6679-7425-40de-944b-e07fc1f90ae7"


def record(attempt: Any = 1, *, status: str = "running", run_id: str = RUN, **context: Any) -> bytes:
    reason = "the sidecar got SIGTERM" if status == "stopping" else None
    doc = {
        "status": status,
        "failure_reason": reason,
        "context": {"run_id": run_id, "attempt": attempt, **context},
    }
    return json.dumps(doc).encode()


def found(
    data: bytes | None, *, final: bool = False, where: str = "s3://b/run/1-a/provisional-0001.json"
) -> FoundAttempt:
    return FoundAttempt(location=where, final=final, record=data, last_unix=1_700_000_000.0)


def test_a_provisional_record_without_a_final_artifact_is_a_lost_attempt() -> None:
    (lost,) = lost_attempts([found(record(1, status="stopping"))], run_id=RUN, index=None, before=2)
    assert (lost.attempt, lost.status, lost.reason) == (1, "stopping", "the sidecar got SIGTERM")
    assert lost.last_evidence_at_utc == "2023-11-14T22:13:20Z"
    assert describe_lost(lost) == (
        "attempt 1 ended without a verdict (last evidence at 2023-11-14T22:13:20Z); it was stopping: "
        "the sidecar got SIGTERM: s3://b/run/1-a/provisional-0001.json"
    )


@pytest.mark.parametrize(
    "place",
    [
        found(record(1), final=True),  # it ended with a verdict
        found(record(1, status="failed")),  # a final artifact (locally artifact.json is replaced)
        found(record(1, run_id="another")),  # another run under a shared prefix
        found(record(1, index=3)),  # another index of a multi-pod soak
        found(record(2)),  # the current attempt itself
        found(record(7)),  # a later one (a stale listing)
        found(record(0)),
        found(record("1")),
        found(record(True)),
        found(None),
        found(b"{not json"),
        found(b"\xff\xfe"),
        found(b"[]"),
        found(json.dumps({"status": "running", "context": []}).encode()),
        found(b" " * (PROVISIONAL_LIMIT_BYTES + 1)),
    ],
)
def test_anything_else_is_left_out(place: FoundAttempt) -> None:
    assert lost_attempts([place], run_id=RUN, index=None, before=2) == []


def test_one_per_attempt_oldest_first_from_every_location() -> None:
    places = [
        found(record(3), where="local/attempt-3/artifact.json"),
        found(record(1), where="local/attempt-1/artifact.json"),
        found(record(3), where="s3://b/run/3-a/provisional-0001.json"),
        found(record(2, index=0)),
    ]
    lost = lost_attempts(places, run_id=RUN, index=None, before=5)
    assert [(each.attempt, each.evidence) for each in lost] == [
        (1, "local/attempt-1/artifact.json"),
        (3, "s3://b/run/3-a/provisional-0001.json"),
    ]
    (index_zero,) = lost_attempts(places, run_id=RUN, index=0, before=5)
    assert index_zero.attempt == 2


def test_a_record_nested_too_deep_is_left_out_not_raised() -> None:
    deep = b'{"status": "running", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert lost_attempts([found(deep), found(record(1))], run_id=RUN, index=None, before=2)[0].attempt == 1


def test_what_others_wrote_is_one_printable_line_of_bounded_size() -> None:
    hostile = "\x1b[2K\rsoak-sidecar: PASSED\n\x1b]0;title\x07" + "A" * 500_000
    doc = json.loads(record(1, status="stopping"))
    doc["failure_reason"] = hostile
    place = found(json.dumps(doc).encode(), where="runs/x\x1b[31m\nFAKE/artifact.json")
    (lost,) = lost_attempts([place], run_id=RUN, index=None, before=2)
    line = describe_lost(lost)
    assert not any(ord(char) < 32 or ord(char) == 127 for char in line), line[:200]
    assert len(line.encode()) < 3000 and "soak-sidecar: PASSED" in line


@pytest.mark.parametrize("last_unix", [1e12, -1.0, float("nan"), float("inf")])
def test_a_time_that_cannot_be_shown_is_left_out(last_unix: float) -> None:
    place = FoundAttempt(location="l", final=False, record=record(1), last_unix=last_unix)
    (lost,) = lost_attempts([place], run_id=RUN, index=None, before=2)
    assert lost.last_evidence_at_utc is None
    assert describe_lost(lost) == "attempt 1 ended without a verdict: l"


@pytest.mark.parametrize(
    ("stamp", "started"),
    [
        ("2023-11-14T22:13:20Z", 1_700_000_000.0),
        ("2023-11-14T22:13:20+00:00", 1_700_000_000.0),
        ("0001-01-01T00:00:00Z", None),  # before 1970: no attempt of ours (the ledger refuses it)
        ("2023-11-14T22:13:20", None),  # no offset: which zone is unknown
        ("not a time", None),
        (12, None),
    ],
)
def test_a_lost_attempts_start_is_its_records_claim_taken_only_when_it_can_be_placed(
    stamp: object, started: float | None
) -> None:
    data = json.loads(record(1))
    data["started_at_utc"] = stamp
    (lost,) = lost_attempts([found(json.dumps(data).encode())], run_id=RUN, index=None, before=2)
    assert lost.started_unix == started and lost.last_evidence_unix == 1_700_000_000.0
