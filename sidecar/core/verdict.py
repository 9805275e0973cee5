"""The verdict: one pass over the run's findings in rank order, and the exit-code table.

Each check emits a ``Finding`` (``sidecar.core.classification``): its class, its reason, who
established it. ``judge`` composes the failure reason (``; ``-joined) in this order:

1. the causes (``Standing.CAUSE``), by their rank in ``RULES``: the deadline (it explains the
   rest), a GPU fault, the monitor's failure (a stall, a stop from outside, a lost lock, a lost
   launcher or sidecar, a launcher the trainer stopped), then the trainer's own end (``decide``
   keeps only the first of: an OOM kill of a trainer that failed, else its death or an unknown exit
   status, a finish before ``min_duration_seconds``, survivors, leaks; and only when the run
   itself found nothing: a trainer that died after the sidecar stopped it did not cause the stop);
2. the run_summary's messages (``SummaryOutcome.reason_parts``): the trainer's account, after
   what the sidecar established;
3. the notes (``Standing.NOTE``), in the order given: named only in a failure's reason (XIDs the
   trainer caused, files it left in /dev/shm);
4. the sidecar's own findings that never pass (``Standing.AFTER``), in the order given: its kill of
   the trainer, a launcher seen stopped; the class only when nothing else failed.

The class is the first cause's, weighed against the trainer's claim (its run_summary's shutdown
classification):

- what the sidecar observed or measured stands over the trainer's account (``OBSERVED``: the
  deadline, a GPU fault, a stall, a stop from outside, a leak or survivors, an OOM kill), e.g. a
  hung trainer killed by the stall's TERM that then reports ``learner_failure`` is still
  ``timeout/stale_tick``;
- a class that names a cause only the sidecar can see (``SEEN_ONLY``: a stop, a stall) counts only
  when the sidecar saw it; otherwise the claim is named in the reason and not taken;
- any other claim replaces the remaining classes, and a provisional cause (an unknown exit
  status, a trainer that ended too soon) takes the summary's class, whichever it is.

An upload that failed (``with_upload_error``) turns only a passed verdict into ``evidence_lost``,
so it never hides the soak's own verdict. A passed verdict has classification None (the
artifact's ``failure_classification``) and exit 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from sidecar.core.classification import (
    CLASSIFICATION_EXIT_CODES,
    MONITOR_KINDS,
    OBSERVED,
    PRE_START_KINDS,
    SEEN_ONLY,
    Classification,
    Finding,
    Source,
    Standing,
    classifications_for,
)
from sidecar.core.exitcodes import EXIT_CODE_DESCRIPTIONS, ExitCode

if TYPE_CHECKING:  # the run_summary package loads pydantic: exit-codes needs only the table
    from sidecar.core.run_summary import SummaryOutcome

# Residual PIDs a reason names (the artifact lists more, and counts them all): a storm of
# survivors must not make the reason, the annotations and the Event the trainer's size.
NAMED_RESIDUALS = 16

DEADLINE_REASON = "the total-job deadline expired before the trainer finished"
BUDGET_REASON = (
    "the budget ran out: the trainer was soft-stopped at the checkpoint margin and had not finished"
)
# How the deadline ended a run (sidecar.core.conclusion.deadline_end).
DeadlineEnd = Literal["expired", "budget_spent"]


def exit_code_table_markdown() -> str:
    """The exit-code table `soak-sidecar exit-codes` prints and the README embeds, generated from
    the two tables so it cannot drift."""
    rows = ["| code | name | retryable | meaning | classifications |", "|---:|---|---|---|---|"]
    for code in ExitCode:
        shown = ", ".join(f"`{name}`" for name in classifications_for(code)) or "-"
        rows.append(
            f"| {int(code)} | {code.name} | {'yes' if code.retryable else 'no'} | "
            f"{EXIT_CODE_DESCRIPTIONS[code]} | {shown} |"
        )
    return "\n".join(rows)


def exit_code_for(classification: Classification | str | None) -> ExitCode:
    """None (passed) is 0; an unknown classification is a bug and raises KeyError."""
    return ExitCode.PASSED if classification is None else CLASSIFICATION_EXIT_CODES[classification]


@dataclass(frozen=True)
class Verdict:
    status: Literal["passed", "failed"]
    classification: Classification | None
    reason: str | None
    exit_code: ExitCode


PASSED = Verdict(status="passed", classification=None, reason=None, exit_code=ExitCode.PASSED)


def _failed(classification: Classification, reason: str) -> Verdict:
    return Verdict(
        status="failed", classification=classification, reason=reason, exit_code=exit_code_for(classification)
    )


def refused(reason: str, *, classification: Classification = Classification.REFUSED) -> Verdict:
    """The verdict of a run that was not started (identity mismatch, no budget, store down)."""
    if classification not in PRE_START_KINDS:
        raise ValueError(f"{classification!r} is not a refusal before the start")
    return _failed(classification, reason)


def stopped(kind: Classification, reason: str) -> Verdict:
    """The verdict of a run the monitor ended before the trainer's outcome could be judged."""
    return _failed(kind, reason)


def decide(
    *,
    monitor_failure: Finding | None,
    returncode: int | None,
    duration_s: float,
    min_duration_s: float,
    residuals: Sequence[str],
    summary: SummaryOutcome,
    leaks: Sequence[Finding] = (),
    deadline: DeadlineEnd | None,
    gpu_fault: Finding | None,
    out_of_memory: Finding | None = None,
    also: Sequence[Finding] = (),
) -> Verdict:
    """The soak's verdict from the run's facts. ``residuals``: short descriptions (pids) of survivors
    of shutdown; ``leaks``: the other resource-leak checks' findings; ``also``: notes and the
    sidecar's own findings that never pass (see ``judge``).

    ``returncode`` None means the trainer's exit status is unknown, which fails closed unless
    something else already failed. ``out_of_memory``: the OOM killer killed a process of the
    trainer's; it classes a failed trainer (whatever its summary says).
    """
    if monitor_failure is not None and monitor_failure.kind not in MONITOR_KINDS:
        raise ValueError(f"unknown monitor failure kind {monitor_failure.kind.value!r}")
    run = [found for found in (deadline_finding(deadline), gpu_fault, monitor_failure) if found is not None]
    ended = trainer_end(
        returncode=returncode,
        duration_s=duration_s,
        min_duration_s=min_duration_s,
        residuals=residuals,
        leaks=leaks,
        out_of_memory=out_of_memory,
    )
    causes = run or ([] if ended is None else [ended])
    return judge([*causes, *also], summary)


def judge(findings: Sequence[Finding], summary: SummaryOutcome) -> Verdict:
    """One pass over the findings: the causes in rank order, then the notes and the sidecar's own
    findings in the order given (see the module docstring). The trainer's account comes only
    through ``summary``, weighed as a claim: never as a cause of its own."""
    claimed = [found for found in findings if found.source in (Source.TRAINER, Source.CONTRACT)]
    if claimed:
        raise ValueError(f"the run_summary's findings are weighed through the summary: {claimed[0]!r}")
    causes = sorted((found for found in findings if found.standing is Standing.CAUSE), key=lambda f: f.rank)
    parts = [found.reason for found in causes]
    parts.extend(summary.reason_parts(after_failure=bool(causes)))
    kind = _weighed(causes, summary, parts) if parts else None
    for standing in (Standing.NOTE, Standing.AFTER):
        for found in (each for each in findings if each.standing is standing):
            if standing is Standing.NOTE and kind is None:
                continue
            parts.append(found.reason)
            kind = kind or found.kind
    return PASSED if kind is None else _failed(kind, "; ".join(parts))


def _weighed(causes: Sequence[Finding], summary: SummaryOutcome, parts: list[str]) -> Classification:
    """The first cause's class once the trainer's claim is weighed; a claim of a cause the sidecar
    did not see is added to ``parts`` instead. The deadline's soft stop or TERM is a stop the
    sidecar saw: a trainer it stopped may say so."""
    first = causes[0] if causes else None
    fallback = Classification.UNKNOWN_FAILURE if first is None else first.kind
    claim = None if summary.classification is None else Classification(summary.classification)
    open_slot = first is None or first.provisional
    if claim is None or not (summary.classification_overrides or open_slot):
        return fallback
    seen = {found.kind for found in causes}
    if claim is Classification.EXTERNAL_CANCELLATION and Classification.DEADLINE_EXHAUSTED in seen:
        return fallback
    if claim in SEEN_ONLY and not seen & SEEN_ONLY[claim]:
        parts.append(f"the trainer's run_summary claims {claim.value!r}, which the sidecar did not see")
        return fallback
    return fallback if first is not None and first.kind in OBSERVED and not first.provisional else claim


def deadline_finding(deadline: DeadlineEnd | None) -> Finding | None:
    if deadline is None:
        return None
    reason = DEADLINE_REASON if deadline == "expired" else BUDGET_REASON
    return Finding(Classification.DEADLINE_EXHAUSTED, reason, Source.SIDECAR)


def trainer_end(
    *,
    returncode: int | None,
    duration_s: float,
    min_duration_s: float,
    residuals: Sequence[str],
    leaks: Sequence[Finding],
    out_of_memory: Finding | None,
) -> Finding | None:
    """The first of the trainer-side rules that fails: its death (the first real cause: a missing
    or abnormal run_summary is its evidence, not its class), a finish too soon to have soaked,
    survivors, leaks."""
    if returncode != 0:
        return _died(returncode, out_of_memory)
    if duration_s < min_duration_s:
        reason = (
            f"the trainer finished after {duration_s:.1f} s, before the soak's minimum duration "
            f"(min_duration_seconds={min_duration_s:.1f})"
        )
        return Finding(Classification.TRAINER_FAILURE, reason, Source.SIDECAR, provisional=True)
    if residuals:
        named = ", ".join(residuals[:NAMED_RESIDUALS])
        more = len(residuals) - NAMED_RESIDUALS
        named += f" and {more} more" if more > 0 else ""
        reason = f"residual child processes after shutdown: {named}"
        return Finding(Classification.RESOURCE_LEAK, reason, Source.SIDECAR)
    if leaks:  # every leak check's finding, named together
        return Finding(Classification.RESOURCE_LEAK, "; ".join(leak.reason for leak in leaks), Source.SIDECAR)
    return None


def _died(returncode: int | None, out_of_memory: Finding | None) -> Finding:
    if out_of_memory is not None:
        return out_of_memory
    if returncode is None:
        reason = "trainer exit status is unknown"
        return Finding(Classification.UNKNOWN_FAILURE, reason, Source.LAUNCHER, provisional=True)
    died = f"trainer exited with returncode {returncode}"
    return Finding(Classification.TRAINER_FAILURE, died, Source.LAUNCHER)


def with_upload_error(verdict: Verdict, upload_error: str) -> Verdict:
    """The verdict once the upload failed: a pass becomes evidence_lost, a failure keeps its kind."""
    if verdict.status == "passed":
        reason = f"soak passed but its artifact was not uploaded: {upload_error}"
        return _failed(Classification.EVIDENCE_LOST, reason)
    return verdict
