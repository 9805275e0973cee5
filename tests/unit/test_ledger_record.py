"""The run's ledger document (pure): entries merged, never dropped; what is read back is what was
written; a forged or damaged ledger is refused with one line, never half-read."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.errors import ConfigError
from sidecar.core.ledger.phases import AttemptMarks, Phase, attempt_phases
from sidecar.core.ledger.record import (
    LEDGER_ENTRIES_LIMIT,
    LEDGER_LIMIT_BYTES,
    LOST,
    LOST_CAUSE,
    Ledger,
    LedgerEntry,
    dumps_ledger,
    parse_ledger,
    with_entry,
)

T0 = 1_700_000_000.0
RUN = "0b6f3f3e-0d6c-4c7e-9d0e-2f1f3a6b7c8d"


def entry(attempt: int, start: float, *, index: int | None = None, status: str = "passed") -> LedgerEntry:
    marks = AttemptMarks(
        start=start, scheduled=start + 1, containers_started=start + 5, go=start + 6,
        first_progress=start + 10, last_checkpoint=start + 50, stop_requested=start + 80, soft_stop=True,
        trainer_exit=start + 85, end=start + 90, passed=status == "passed",
    )  # fmt: skip
    split = attempt_phases(marks)
    classification = None if status == "passed" else "evicted"
    return LedgerEntry(
        attempt,
        index,
        status,
        classification,
        start,
        start + 90,
        split.phases,
        split.lost_work_known,
        "s3://b/k",
    )


def add(ledger: Ledger | None, each: LedgerEntry) -> Ledger:
    return with_entry(ledger, each, run_id=RUN, deadline_started_unix=T0)


def test_attempts_are_added_in_order_and_the_budget_joins_them() -> None:
    ledger = add(add(None, entry(2, T0 + 100)), entry(1, T0, status="cancelled"))
    assert [e.attempt for e in ledger.entries] == [1, 2] and ledger.revision == 2
    budget = ledger.budget()
    assert budget.wall_s == 190
    assert budget.productive_s == (50 - 10) + (80 - 10)  # attempt 1 lost the work after its checkpoint
    assert budget.badput_s["evicted"] == pytest.approx(30 + 10 + 10)  # lost work, the wait, the restart


def test_the_same_attempt_is_replaced_and_a_lost_one_never_replaces_a_verdict() -> None:
    ledger = add(None, entry(1, T0, status="failed"))
    again = add(ledger, entry(1, T0))
    assert [e.status for e in again.entries] == ["passed"]
    lost = LedgerEntry(1, None, LOST, None, T0, T0 + 30, ())
    assert add(again, lost) is again  # nothing to write
    assert add(None, lost).entries[0].cause == LOST_CAUSE


def test_indexes_are_kept_apart() -> None:
    ledger = add(add(add(None, entry(1, T0, index=1)), entry(1, T0, index=0)), entry(2, T0 + 100, index=1))
    assert [(e.index, e.attempt) for e in ledger.entries] == [(0, 1), (1, 1), (1, 2)]


def test_another_runs_ledger_is_refused() -> None:
    ledger = add(None, entry(1, T0))
    with pytest.raises(ConfigError, match="not"):
        with_entry(ledger, entry(2, T0), run_id="another", deadline_started_unix=T0)


@given(
    st.lists(
        st.tuples(
            st.integers(1, 5),
            st.one_of(st.none(), st.integers(0, 3)),
            st.floats(0, 1e6),
            st.sampled_from(["passed", "failed", LOST]),
        ),
        max_size=12,
    )
)
def test_what_is_written_reads_back_the_same(items: list[tuple[int, int | None, float, str]]) -> None:
    ledger: Ledger | None = None
    for attempt, index, offset, status in items:
        ledger = add(ledger, entry(attempt, T0 + offset, index=index, status=status))
    if ledger is None:
        return
    back = parse_ledger(dumps_ledger(ledger, now=T0), "ledger.json")
    assert back.run_id == RUN and back.revision == ledger.revision
    assert [(e.key, e.status, e.classification, e.lost_work_known) for e in back.entries] == [
        (e.key, e.status, e.classification, e.lost_work_known) for e in ledger.entries
    ]
    assert back.budget().goodput == pytest.approx(ledger.budget().goodput, abs=1e-6)


def document(**changes: object) -> bytes:
    doc = json.loads(dumps_ledger(add(None, entry(1, T0)), now=T0))
    doc.update(changes)
    return json.dumps(doc).encode()


def attempt_doc(**changes: object) -> bytes:
    doc = json.loads(document())
    doc["attempts"][0].update(changes)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"\xff", "not JSON"),
        (b"[]", "must be an object"),
        (b'{"schema": "soak-sidecar/ledger/1", "schema": "x"}', "duplicate key"),
        (document(schema="other"), "schema"),
        (document(run_id="a\nb"), "printable"),
        (document(revision=-1), "at least 0"),
        (document(attempts={}), "must be a list"),
        (attempt_doc(attempt=0), "at least 1"),
        (attempt_doc(start_unix=float("nan")), "number"),
        (attempt_doc(end_unix=T0 - 1), "before"),
        (attempt_doc(lost_work_known="yes"), "true or false"),
        (attempt_doc(phases=[["napping", T0, 1]]), "known kind"),
        (attempt_doc(phases=[["productive", T0, 10], ["teardown", T0 + 5, 10]]), "overlaps"),
        (attempt_doc(phases=[["productive", T0, 1e9]]), "outside"),
        (attempt_doc(status="x" * 2000), "at most"),
        (b" " * (LEDGER_LIMIT_BYTES + 1), "larger than"),
    ],
)
def test_a_forged_or_damaged_ledger_is_refused_with_one_line(data: bytes, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as caught:
        parse_ledger(data, "s3://b/ledger.json")
    assert "\n" not in str(caught.value)


def test_an_attempt_listed_twice_or_too_many_attempts_are_refused() -> None:
    doc = json.loads(document())
    doc["attempts"].append(doc["attempts"][0])
    with pytest.raises(ConfigError, match="twice"):
        parse_ledger(json.dumps(doc).encode(), "ledger.json")
    doc["attempts"] = [doc["attempts"][0]] * (LEDGER_ENTRIES_LIMIT + 1)
    with pytest.raises(ConfigError, match="more than"):
        parse_ledger(json.dumps(doc).encode(), "ledger.json")


def test_the_written_budget_is_what_the_entries_add_up_to() -> None:
    ledger = add(add(None, entry(1, T0, status="failed")), entry(2, T0 + 100))
    doc = json.loads(dumps_ledger(ledger, now=T0 + 200))
    assert doc["budget"]["wall_s"] == 190 and doc["budget"]["goodput"] == pytest.approx(110 / 190, abs=1e-6)
    assert sum(doc["budget"]["badput_s"].values()) + doc["budget"]["productive_s"] == pytest.approx(190)
    assert doc["attempts"][0]["phases"][0] == ["scheduling", T0, 1.0]
    assert Phase("scheduling", T0, T0 + 1) == ledger.entries[0].phases[0]


def test_a_ledger_readers_would_refuse_is_never_written() -> None:
    long = "s3://b/" + "k" * 1000
    entries = tuple(
        LedgerEntry(n, None, "passed", None, T0, T0 + 1, (), artifact=long) for n in range(1, 17_001)
    )
    with pytest.raises(ConfigError, match="larger than"):
        dumps_ledger(Ledger(RUN, T0, entries), now=T0)


def test_an_attempt_its_readers_would_refuse_is_never_added() -> None:
    with pytest.raises(ConfigError, match="start_unix"):
        add(None, LedgerEntry(1, None, LOST, None, -62135596800.0, T0, ()))
