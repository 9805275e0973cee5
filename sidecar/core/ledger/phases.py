"""Where one attempt's wall time went (pure): its phases, from the moments the sidecar saw.

The phases partition the attempt, from its first known moment (the pod's creation, else the
sidecar's start) to its end (the verdict, or a lost attempt's last evidence), with neither overlap
nor gap: each moment closes one phase and opens the next. The moments come from different clocks
(the API server's, the node's), so one that lies before the moment ahead of it, or outside the
attempt, is moved onto its neighbour: a phase is never negative. A moment not known merges its phase
into the one before (no phase is guessed).

Work is productive from the first progress until the trainer stopped, unless the attempt did not
pass: then only up to its last reported checkpoint, and the rest is lost work (none when the
checkpoint was written once the stop was asked for). Without a checkpoint reported, the lost work is
not guessed: ``lost_work_known`` is False and the time stays productive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

PhaseKind = Literal[
    "scheduling",  # pod created -> scheduled
    "container_start",  # scheduled -> containers started (image pulls, init containers)
    "launcher",  # containers started -> go-ahead (launcher ready, identity, approval, deadline)
    "startup",  # go-ahead -> first progress
    "productive",  # progress kept: up to the stop, or to the last checkpoint of a failed attempt
    "lost_work",  # after the last checkpoint of an attempt that did not pass
    "checkpointing",  # soft stop -> the trainer's exit
    "teardown",  # the trainer's exit -> the verdict (post-shutdown grace, residual check, upload)
]
PHASES: tuple[PhaseKind, ...] = (
    "scheduling",
    "container_start",
    "launcher",
    "startup",
    "productive",
    "lost_work",
    "checkpointing",
    "teardown",
)


@dataclass(frozen=True)
class AttemptMarks:
    """The moments of one attempt (Unix seconds); None where the sidecar did not see one."""

    start: float
    end: float
    # What begins at ``start``: the pod's creation (scheduling), or, without a pod, the sidecar's
    # start (launcher).
    start_kind: PhaseKind = "scheduling"
    scheduled: float | None = None
    containers_started: float | None = None
    go: float | None = None
    first_progress: float | None = None
    last_checkpoint: float | None = None
    # The soft stop (a deadline's margin, a stop from outside), else the first TERM.
    stop_requested: float | None = None
    soft_stop: bool = False
    trainer_exit: float | None = None
    passed: bool = False


@dataclass(frozen=True)
class Phase:
    kind: PhaseKind
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class AttemptPhases:
    phases: tuple[Phase, ...]
    # False when the attempt did not pass and reported no checkpoint: its lost work is unknown.
    lost_work_known: bool

    def seconds(self, kind: PhaseKind) -> float:
        return sum(phase.seconds for phase in self.phases if phase.kind == kind)


def attempt_phases(marks: AttemptMarks) -> AttemptPhases:
    end = max(marks.start, marks.end)
    work_end = marks.stop_requested if marks.stop_requested is not None else marks.trainer_exit
    checkpoint = marks.last_checkpoint
    if marks.passed or checkpoint is None or marks.first_progress is None:
        lost_from, lost_known = None, marks.passed or marks.first_progress is None
    elif work_end is not None and checkpoint >= work_end:  # saved when asked to stop: nothing lost
        lost_from, lost_known = None, True
    else:
        lost_from, lost_known = max(checkpoint, marks.first_progress), True
    opening: Sequence[tuple[PhaseKind, float | None]] = (
        ("scheduling", None),
        ("container_start", marks.scheduled),
        ("launcher", marks.containers_started),
        ("startup", marks.go),
        ("productive", marks.first_progress),
        ("lost_work", lost_from),
        ("checkpointing", work_end if marks.soft_stop else None),
        ("teardown", marks.trainer_exit),
    )
    phases: list[Phase] = []
    kind, at = marks.start_kind, marks.start
    for next_kind, moment in opening[PHASES.index(marks.start_kind) + 1 :]:
        if moment is None:
            continue
        closed = min(max(moment, at), end)  # clocks differ: never before the phase it closes
        phases.append(Phase(kind, at, closed))
        kind, at = next_kind, closed
    phases.append(Phase(kind, at, end))
    return AttemptPhases(tuple(p for p in phases if p.seconds > 0), lost_known)
