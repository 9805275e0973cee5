"""One verdict for a soak Job from the verdicts of its pods.

Pure. A single-pod soak passes when its latest attempt passed. A multi-pod soak (an Indexed Job)
passes only when every index has a latest attempt that passed and the Job itself is Complete: an
index that never ran, or a Job the controller failed, is no pass whatever the pods say.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class AttemptOutcome:
    """One pod's attempt, oldest first in the sequence given to ``job_verdict``."""

    index: int | None
    attempt: int
    passed: bool
    # How many indexes the pod said its soak has (published with its verdict), if it said.
    indexes: int | None = None


@dataclass(frozen=True)
class JobVerdict:
    passed: bool
    reason: str


def job_verdict(outcomes: Sequence[AttemptOutcome], *, job_condition: str | None) -> JobVerdict:
    """``job_condition``: the Job's ``Complete``/``Failed`` condition, None while it has neither
    (or when it cannot be read)."""
    if not outcomes:
        return JobVerdict(False, "the Job has no pods")
    if all(outcome.index is None for outcome in outcomes):
        latest = outcomes[-1]
        if latest.passed:
            return JobVerdict(True, f"attempt {latest.attempt} passed")
        return JobVerdict(False, f"attempt {latest.attempt} did not pass")
    return _indexed(outcomes, job_condition)


def _indexed(outcomes: Sequence[AttemptOutcome], job_condition: str | None) -> JobVerdict:
    latest: dict[int, AttemptOutcome] = {}
    for outcome in outcomes:
        if outcome.index is not None:
            latest[outcome.index] = outcome
    declared = [outcome.indexes for outcome in outcomes if outcome.indexes is not None]
    expected = max([*declared, max(latest) + 1])
    problems = [f"index {index} has no pod" for index in range(expected) if index not in latest]
    problems += [
        f"index {index} attempt {outcome.attempt} did not pass"
        for index, outcome in sorted(latest.items())
        if not outcome.passed
    ]
    if job_condition != "Complete":
        problems.append("the Job is not Complete" if job_condition is None else f"the Job is {job_condition}")
    if problems:
        return JobVerdict(False, "; ".join(problems))
    return JobVerdict(True, f"all {expected} indexes passed and the Job is Complete")
