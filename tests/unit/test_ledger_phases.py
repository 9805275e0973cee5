"""Where an attempt's wall time went (pure): phases that partition it whatever the moments say."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.ledger.phases import PHASES, AttemptMarks, attempt_phases

T0 = 1_700_000_000.0


def kinds_and_seconds(marks: AttemptMarks) -> list[tuple[str, float]]:
    return [(p.kind, p.seconds) for p in attempt_phases(marks).phases]


def test_a_drained_attempt_loses_the_work_since_its_last_checkpoint() -> None:
    marks = AttemptMarks(
        start=T0, scheduled=T0 + 2, containers_started=T0 + 12, go=T0 + 15, first_progress=T0 + 45,
        last_checkpoint=T0 + 600, stop_requested=T0 + 900, soft_stop=True, trainer_exit=T0 + 905,
        end=T0 + 910,
    )  # fmt: skip
    assert kinds_and_seconds(marks) == [
        ("scheduling", 2), ("container_start", 10), ("launcher", 3), ("startup", 30),
        ("productive", 555), ("lost_work", 300), ("checkpointing", 5), ("teardown", 5),
    ]  # fmt: skip
    assert attempt_phases(marks).lost_work_known


def test_a_checkpoint_written_when_asked_to_stop_loses_nothing() -> None:
    marks = AttemptMarks(
        start=T0, start_kind="launcher", go=T0 + 1, first_progress=T0 + 2, stop_requested=T0 + 50,
        soft_stop=True, last_checkpoint=T0 + 52, trainer_exit=T0 + 53, end=T0 + 54,
    )  # fmt: skip
    assert kinds_and_seconds(marks) == [
        ("launcher", 1), ("startup", 1), ("productive", 48), ("checkpointing", 3), ("teardown", 1)
    ]  # fmt: skip


def test_without_a_checkpoint_lost_work_is_not_guessed() -> None:
    failed = AttemptMarks(start=T0, go=T0 + 1, first_progress=T0 + 2, trainer_exit=T0 + 100, end=T0 + 101)
    phases = attempt_phases(failed)
    assert (
        not phases.lost_work_known and phases.seconds("lost_work") == 0 and phases.seconds("productive") == 98
    )
    assert attempt_phases(AttemptMarks(**{**failed.__dict__, "passed": True})).lost_work_known


def test_a_lost_attempt_ends_at_its_last_evidence() -> None:
    marks = AttemptMarks(
        start=T0,
        start_kind="launcher",
        go=T0 + 5,
        first_progress=T0 + 10,
        last_checkpoint=T0 + 60,
        end=T0 + 100,
    )
    assert kinds_and_seconds(marks) == [
        ("launcher", 5),
        ("startup", 5),
        ("productive", 50),
        ("lost_work", 40),
    ]


moments = st.one_of(st.none(), st.floats(T0 - 100, T0 + 1000, allow_nan=False))


@given(
    st.builds(
        AttemptMarks,
        start=st.floats(T0, T0 + 10),
        end=st.floats(T0 - 50, T0 + 1000),
        start_kind=st.sampled_from(["scheduling", "launcher"]),
        scheduled=moments,
        containers_started=moments,
        go=moments,
        first_progress=moments,
        last_checkpoint=moments,
        stop_requested=moments,
        soft_stop=st.booleans(),
        trainer_exit=moments,
        passed=st.booleans(),
    )
)
def test_phases_partition_the_attempt_in_order_whatever_the_clocks_say(marks: AttemptMarks) -> None:
    start, end = marks.start, marks.end
    phases = attempt_phases(marks).phases
    assert all(p.seconds > 0 for p in phases)
    assert all(a.end == b.start for a, b in itertools.pairwise(phases))
    assert [PHASES.index(p.kind) for p in phases] == sorted(PHASES.index(p.kind) for p in phases)
    total = sum(p.seconds for p in phases)
    assert abs(total - max(0.0, end - start)) < 1e-6
    if phases:
        assert phases[0].start == start and phases[-1].end == max(start, end)
