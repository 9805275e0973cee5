"""Where a run's budget went (pure): every second from the deadline's start counted once, as
productive or as badput charged to a cause."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.ledger.budget import BEFORE_FIRST, FIRST_START, OVERHEAD, AttemptEntry, run_budget
from sidecar.core.ledger.phases import AttemptMarks, attempt_phases

T0 = 1_700_000_000.0


def entry(attempt: int, marks: AttemptMarks, cause: str | None, index: int | None = None) -> AttemptEntry:
    return AttemptEntry(attempt, index, marks.start, marks.end, attempt_phases(marks), cause)


DRAINED = AttemptMarks(
    start=T0, scheduled=T0 + 2, containers_started=T0 + 12, go=T0 + 15, first_progress=T0 + 45,
    last_checkpoint=T0 + 600, stop_requested=T0 + 900, soft_stop=True, trainer_exit=T0 + 905, end=T0 + 910,
)  # fmt: skip
RESUMED = AttemptMarks(
    start=T0 + 940, scheduled=T0 + 941, containers_started=T0 + 950, go=T0 + 952, first_progress=T0 + 980,
    trainer_exit=T0 + 1980, end=T0 + 1990, passed=True,
)  # fmt: skip


def test_a_drained_soak_charges_its_restart_to_the_drain() -> None:
    budget = run_budget(
        [entry(2, RESUMED, None), entry(1, DRAINED, "evicted")], deadline_start=T0 - 5, until=T0 + 1990
    )
    assert budget.wall_s == 1995 and budget.productive_s == 555 + 1000
    # lost work 300, the 30 s until the new pod, its 40 s to first progress
    assert budget.badput_s == {BEFORE_FIRST: 5, FIRST_START: 45, "evicted": 370, OVERHEAD: 20}
    assert abs(budget.goodput - 1555 / 1995) < 1e-9


def test_a_run_still_waiting_for_its_next_attempt_charges_the_wait_to_the_last_cause() -> None:
    budget = run_budget([entry(1, DRAINED, "evicted")], deadline_start=T0, until=T0 + 1000)
    assert budget.badput_s["evicted"] == 300 + 90


def test_indexes_each_count_the_whole_wall_time() -> None:
    budget = run_budget(
        [entry(1, DRAINED, "evicted", index=0), entry(1, RESUMED, None, index=1)],
        deadline_start=T0,
        until=T0 + 2000,
    )
    assert budget.wall_s == 2000
    assert abs(budget.productive_s + sum(budget.badput_s.values()) - 2 * 2000) < 1e-6
    assert abs(budget.goodput - (555 + 1000) / 4000) < 1e-9


def test_a_span_below_the_float_resolution_leaves_no_zero_entry() -> None:
    # Hypothesis found it: one float step after a Unix time (2.4e-07 s) rounds to nothing.
    assert run_budget([], deadline_start=T0, until=math.nextafter(T0, math.inf)).badput_s == {}


def test_no_attempt_is_all_before_the_first() -> None:
    assert run_budget([], deadline_start=T0, until=T0 + 60).badput_s == {BEFORE_FIRST: 60}


moment = st.floats(T0 - 500, T0 + 5000, allow_nan=False)
marks = st.builds(
    AttemptMarks,
    start=moment,
    end=moment,
    go=st.one_of(st.none(), moment),
    first_progress=st.one_of(st.none(), moment),
    last_checkpoint=st.one_of(st.none(), moment),
    trainer_exit=st.one_of(st.none(), moment),
    passed=st.booleans(),
)


@given(
    st.lists(
        st.tuples(marks, st.sampled_from([None, "evicted", "stale_progress"]), st.sampled_from([None, 0, 1]))
    ),
    st.floats(T0 - 100, T0 + 100),
    st.floats(0, 6000),
)
def test_every_second_is_counted_once(
    attempts: list[tuple[AttemptMarks, str | None, int | None]], deadline_start: float, span: float
) -> None:
    entries = [entry(n, m, cause, index) for n, (m, cause, index) in enumerate(attempts, 1)]
    budget = run_budget(entries, deadline_start=deadline_start, until=deadline_start + span)
    indexes = max(1, len({e.index for e in entries}))
    assert all(seconds > 0 for seconds in budget.badput_s.values())
    assert abs(budget.productive_s + sum(budget.badput_s.values()) - span * indexes) < 1e-3
    assert 0 <= budget.goodput <= 1 + 1e-9
