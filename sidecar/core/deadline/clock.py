"""The attempt's clock: remaining time bounded by every clock that applies, and the check that
refuses to start with the checkpoint margin or less left."""

from __future__ import annotations

from sidecar.core.boot import BootClock, ReferenceTime, StoreClock
from sidecar.core.deadline.record import DeadlineRecord
from sidecar.core.errors import DeadlineExpiredError, InsufficientBudgetError, RefusedError

# How far the wall clock may claim more time left than CLOCK_BOOTTIME on the same boot: both count
# real time (suspend included), so under NTP they agree to well under a second.
CLOCK_SKEW_TOLERANCE_S = 60.0


class DeadlineClock:
    """Remaining time of one attempt, bounded by every clock that applies.

    At construction, the least of: the wall clock's remaining time; on the record's own boot, the
    budget less the CLOCK_BOOTTIME elapsed since the record was made; where the record holds a
    reference time (the apiserver's) and the same clock is read now, the budget less the reference
    time elapsed since; and where the store tells its own time, the budget less the store-clock time
    elapsed since it wrote the record. A wall
    clock that claims more than another clock by over CLOCK_SKEW_TOLERANCE_S was set back (or is
    behind the store's): refused with the figures. A wall clock ahead only shortens the run. From
    then on the attempt runs on its monotonic clock: a later wall-clock step back raises only the
    wall estimate, which the minimum ignores. ``wall_end`` is the attempt's deadline in this node's
    wall clock (go.json's).
    """

    def __init__(
        self,
        record: DeadlineRecord,
        *,
        now_wall: float,
        now_monotonic: float,
        boot: BootClock | None = None,
        reference: ReferenceTime | None = None,
        store: StoreClock | None = None,
    ) -> None:
        self.record = record
        remaining = record.deadline_unix - now_wall
        anchor = record.boot
        if anchor is not None and boot is not None and boot.boot_id == anchor.boot_id:
            by_boot = record.budget_seconds - (boot.boottime_s - anchor.boottime_s)
            remaining = _least(record, remaining, by_boot, "CLOCK_BOOTTIME on the same boot")
        outside = _reference_clock(record, reference)
        for clock in (outside, store):
            if clock is not None:
                _require_written_when_started(record, clock)
                by_clock = record.budget_seconds - (clock.now - clock.record_written)
                remaining = _least(record, remaining, by_clock, clock.source)
        self.wall_end = now_wall + remaining
        self.monotonic_end = now_monotonic + max(0.0, remaining)

    @property
    def checkpoint_margin_s(self) -> float:
        return self.record.checkpoint_margin_seconds

    def remaining(self, now_wall: float, now_monotonic: float) -> float:
        return min(self.wall_end - now_wall, self.monotonic_end - now_monotonic)

    def expired(self, now_wall: float, now_monotonic: float) -> bool:
        return self.remaining(now_wall, now_monotonic) <= 0


def _reference_clock(record: DeadlineRecord, now: ReferenceTime | None) -> StoreClock | None:
    """The reference clock's reading when the record was made and now, if both come from one clock."""
    made = record.reference
    if made is None or now is None or made.source != now.source:
        return None
    return StoreClock(record_written=made.unix, now=now.unix, source=made.source)


def _least(record: DeadlineRecord, by_wall: float, other: float, source: str) -> float:
    """The smaller remaining time; a wall clock claiming more than ``source`` beyond the tolerance
    is refused with both figures, never believed."""
    if by_wall - other > CLOCK_SKEW_TOLERANCE_S:
        raise RefusedError(
            f"the wall clock claims {by_wall:.1f} s left for run {record.identity.run_id} but {source} "
            f"says {other:.1f} s ({by_wall - other:.1f} s apart, tolerance {CLOCK_SKEW_TOLERANCE_S:g} s): "
            "the wall clock was set back or is behind; refusing rather than grant the difference"
        )
    return min(by_wall, other)


def _require_written_when_started(record: DeadlineRecord, store: StoreClock) -> None:
    """A record that says it started later than the store wrote it grants time it never had (a
    record made by a node whose clock was ahead, or rewritten with a shifted window)."""
    late = record.started_unix - store.record_written
    if late > CLOCK_SKEW_TOLERANCE_S:
        raise RefusedError(
            f"deadline record of run {record.identity.run_id} says it started at {record.started_unix:.1f}, "
            f"{late:.1f} s later than {store.source} dates its making ({store.record_written:.1f}; tolerance "
            f"{CLOCK_SKEW_TOLERANCE_S:g} s): refusing the time it would grant"
        )


def check_startable(clock: DeadlineClock, now_wall: float, now_monotonic: float) -> None:
    """Refuse to start or resume when no more than the checkpoint margin is left."""
    remaining = clock.remaining(now_wall, now_monotonic)
    run_id = clock.record.identity.run_id
    if remaining <= 0:
        raise DeadlineExpiredError(
            f"original job deadline expired {-remaining:.1f} s ago (run {run_id}); no fresh budget"
        )
    if remaining <= clock.checkpoint_margin_s:
        raise InsufficientBudgetError(
            f"insufficient original budget to start/resume: {remaining:.1f} s left, "
            f"checkpoint margin {clock.checkpoint_margin_s:g} s (run {run_id})"
        )
