"""Where a run's budget went (pure): every attempt of every index on one time line, from the
deadline's start to now (or the run's end).

Goodput is the productive share of that wall time (per index, averaged over the indexes). Badput
is charged to causes: the restart after an attempt that did not pass (its lost work, the time until
the next attempt began, and the next attempt's way to its first progress) to the cause that ended
it; the first attempt's way to its first progress to ``first start``; time before the first attempt
to ``before the first attempt``; what is left of each attempt (checkpointing, teardown, a failed
attempt's productive time is still productive) to ``overhead``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.core.ledger.phases import AttemptPhases, PhaseKind

FIRST_START = "first start"
BEFORE_FIRST = "before the first attempt"
OVERHEAD = "overhead"
# Phases that are the way from an attempt's start to its first progress.
STARTING: frozenset[PhaseKind] = frozenset({"scheduling", "container_start", "launcher", "startup"})


@dataclass(frozen=True)
class AttemptEntry:
    attempt: int
    index: int | None
    start: float
    end: float
    phases: AttemptPhases
    # The classification that ended it ("evicted", "stale_progress", ...); None when it passed.
    cause: str | None


@dataclass(frozen=True)
class RunBudget:
    wall_s: float  # from the deadline's start to ``until``, per index
    productive_s: float  # summed over the indexes
    goodput: float  # productive / (wall x indexes)
    badput_s: dict[str, float]  # cause -> seconds, summed over the indexes


def run_budget(entries: Sequence[AttemptEntry], *, deadline_start: float, until: float) -> RunBudget:
    by_index: dict[int | None, list[AttemptEntry]] = defaultdict(list)
    for entry in sorted(entries, key=lambda e: (e.start, e.attempt)):
        by_index[entry.index].append(entry)
    wall = max(0.0, until - deadline_start)
    badput: dict[str, float] = defaultdict(float)
    productive = 0.0
    for attempts in list(by_index.values()) or [[]]:  # no attempt yet: all of it before the first
        productive += _index(attempts, deadline_start, until, badput)
    indexes = max(1, len(by_index))
    return RunBudget(
        wall_s=wall,
        productive_s=productive,
        goodput=productive / (wall * indexes) if wall > 0 else 0.0,
        # Rounded first, then filtered: a span below a Unix time's float resolution (~2.4e-7 s) is
        # noise, and must not survive as a zero entry.
        badput_s={cause: rounded for cause, seconds in badput.items() if (rounded := round(seconds, 6)) > 0},
    )


def _index(
    attempts: Sequence[AttemptEntry], deadline_start: float, until: float, badput: dict[str, float]
) -> float:
    """One index's attempts in order: its productive seconds; its badput added to ``badput``.
    Every second of [deadline_start, until] is counted once (overlaps and the time past ``until``
    are clipped)."""
    productive = 0.0
    covered = max(deadline_start, min(until, attempts[0].start if attempts else until))
    badput[BEFORE_FIRST] += covered - deadline_start
    charge = FIRST_START
    for entry in attempts:
        gap_end = min(until, max(covered, entry.start))
        badput[charge] += gap_end - covered  # waiting for this attempt: the previous one's cause
        covered = gap_end
        for phase in entry.phases.phases:
            start, end = max(covered, phase.start), min(until, phase.end)
            if end <= start:
                continue
            if phase.kind == "productive":
                productive += end - start
            elif phase.kind == "lost_work":  # this attempt's own cause lost it
                badput[entry.cause or OVERHEAD] += end - start
            else:
                badput[charge if phase.kind in STARTING else OVERHEAD] += end - start
            covered = end
        charge = entry.cause or OVERHEAD
    badput[charge if charge != FIRST_START else BEFORE_FIRST] += max(0.0, until - covered)
    return productive
