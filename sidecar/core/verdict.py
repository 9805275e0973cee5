"""The verdict: a pure function of what the supervisor observed, and the exit-code table.

``decide`` composes the failure reason (``; ``-joined) in this order:

1. the monitor's own failure (startup/stale timeout, cancellation, monitor crash, ...);
2. ``trainer exited with returncode N``, only if nothing failed yet (``trainer_failure``: a trainer
   that died is the first real cause and a missing or invalid run_summary its evidence, never its
   class);
3. the trainer finished before ``min_duration_seconds=...`` (``trainer_failure``: a soak that
   ended too soon did not soak), only if nothing failed yet;
4. ``residual child processes after shutdown: ...`` (``resource_leak``), only if nothing failed yet;
5. the run_summary's messages (see ``SummaryOutcome.reason_parts``).

and its classification rules. A valid abnormal shutdown classification from the trainer does not
replace any earlier kind, because the trainer writes its summary itself:

- what the sidecar observed or measured stands over the trainer's account (``OBSERVED``: a stall,
  a stop from outside, a leak or survivors, an OOM kill), e.g. a hung trainer killed by the stall's
  TERM that then reports ``learner_failure`` is still ``timeout/stale_tick``;
- a class that names a cause only the sidecar can see (``SEEN_ONLY``: a stop, a stall) counts only
  when the sidecar saw it; otherwise the claim is named in the reason and not taken;
- any other claim (the trainer's own failure) replaces the remaining kinds and fills an empty slot;
  a failure with no kind is ``unknown_failure``.

Ahead of everything above, because they explain the rest:

- ``deadline``: the total-job deadline expired, or the budget was spent (soft stop at the
  checkpoint margin, trainer unfinished); ``deadline_exhausted`` outranks the trainer's non-zero
  exit and summary, which the stop at the deadline caused.
- ``gpu_fault``: a GPU was lost or needs a reset; ``gpu_fault`` (retryable on another node).
- ``upload_error``: kept in ``evidence_error`` always, but it turns the verdict into
  ``evidence_lost`` only when the soak otherwise passed, so it never hides the soak's own verdict.

A passed verdict has classification None (the artifact's ``failure_classification``) and exit 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from sidecar.core.classification import (
    CLASSIFICATION_EXIT_CODES,
    MONITOR_KINDS,
    OBSERVED,
    PRE_START_KINDS,
    SEEN_ONLY,
    Classification,
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
    evidence_error: str | None = None


def _failed(classification: Classification, reason: str, evidence_error: str | None) -> Verdict:
    return Verdict(
        status="failed",
        classification=classification,
        reason=reason,
        exit_code=exit_code_for(classification),
        evidence_error=evidence_error,
    )


def refused(reason: str, *, classification: Classification = Classification.REFUSED) -> Verdict:
    """The verdict of a run that was not started (identity mismatch, no budget, store down)."""
    if classification not in PRE_START_KINDS:
        raise ValueError(f"{classification!r} is not a refusal before the start")
    return _failed(classification, reason, None)


def stopped(kind: Classification, reason: str) -> Verdict:
    """The verdict of a run the monitor ended before the trainer's outcome could be judged."""
    return _failed(kind, reason, None)


def decide(
    *,
    monitor_failure: tuple[Classification, str] | None,
    returncode: int | None,
    duration_s: float,
    min_duration_s: float,
    residuals: Sequence[str],
    summary: SummaryOutcome,
    leaks: Sequence[str] = (),
    deadline: DeadlineEnd | None,
    gpu_fault: str | None,
    upload_error: str | None,
    out_of_memory: str | None = None,
) -> Verdict:
    """The soak's verdict. ``residuals``: short descriptions (pids) of survivors of shutdown;
    ``leaks``: complete messages of other resource-leak checks, reported like residuals (only
    when nothing failed before, classification ``resource_leak``).

    ``returncode`` None means the trainer's exit status is unknown, which fails closed unless
    something else already failed. ``out_of_memory``: why the OOM killer is the cause, when it
    killed a process of the trainer's; it classes a failed trainer (whatever its summary says).
    """
    parts, kind = _run_failures(deadline, gpu_fault, monitor_failure)
    if not parts:
        parts, kind = _trainer_failure(
            returncode=returncode,
            duration_s=duration_s,
            min_duration_s=min_duration_s,
            residuals=residuals,
            leaks=leaks,
            out_of_memory=out_of_memory,
        )
    parts.extend(summary.reason_parts(after_failure=bool(parts)))
    kind = _with_summary_kind(kind, summary, parts, deadline_stopped=deadline is not None)
    if deadline is not None:
        kind = Classification.DEADLINE_EXHAUSTED
    elif gpu_fault is not None:
        kind = Classification.GPU_FAULT

    if parts:
        # Kindless so far: a summary's kind fills the slot first; a trainer that
        # finished too soon, and nothing else, is the trainer's failure.
        too_short = returncode == 0 and duration_s < min_duration_s
        fallback = Classification.TRAINER_FAILURE if too_short else Classification.UNKNOWN_FAILURE
        return _failed(kind or fallback, "; ".join(parts), upload_error)
    passed = Verdict(status="passed", classification=None, reason=None, exit_code=ExitCode.PASSED)
    return passed if upload_error is None else with_upload_error(passed, upload_error)


def _with_summary_kind(
    kind: Classification | None, summary: SummaryOutcome, parts: list[str], *, deadline_stopped: bool
) -> Classification | None:
    """The kind once the summary's classification is weighed (see the module docstring); a claim
    of a cause the sidecar did not see is added to ``parts`` instead. The deadline's soft stop or
    TERM is a stop the sidecar saw: a trainer it stopped may say so (the deadline is the kind)."""
    claim = None if summary.classification is None else Classification(summary.classification)
    if claim is None or not (summary.classification_overrides or kind is None):
        return kind
    if claim is Classification.EXTERNAL_CANCELLATION and deadline_stopped:
        return kind
    if claim in SEEN_ONLY and kind not in SEEN_ONLY[claim]:
        parts.append(f"the trainer's run_summary claims {claim.value!r}, which the sidecar did not see")
        return kind
    return kind if kind in OBSERVED else claim


def _run_failures(
    deadline: DeadlineEnd | None,
    gpu_fault: str | None,
    monitor_failure: tuple[Classification, str] | None,
) -> tuple[list[str], Classification | None]:
    """What ended or broke the run itself (deadline, GPU, monitor), all of it, and the monitor's kind."""
    parts: list[str] = []
    if deadline is not None:
        parts.append(DEADLINE_REASON if deadline == "expired" else BUDGET_REASON)
    if gpu_fault is not None:
        parts.append(f"GPU fault: {gpu_fault}")
    if monitor_failure is None:
        return parts, None
    monitor_kind, monitor_reason = monitor_failure
    if monitor_kind not in MONITOR_KINDS:
        raise ValueError(f"unknown monitor failure kind {monitor_kind!r}")
    parts.append(monitor_reason)
    return parts, monitor_kind


def _trainer_failure(
    *,
    returncode: int | None,
    duration_s: float,
    min_duration_s: float,
    residuals: Sequence[str],
    leaks: Sequence[str],
    out_of_memory: str | None,
) -> tuple[list[str], Classification | None]:
    """The first of the trainer-side rules that fails (each only if nothing failed yet)."""
    if returncode != 0:
        return _trainer_died(returncode, out_of_memory)
    if duration_s < min_duration_s:
        # The trainer finished too soon to have soaked (kind: see decide).
        return [
            f"the trainer finished after {duration_s:.1f} s, before the soak's minimum duration "
            f"(min_duration_seconds={min_duration_s:.1f})"
        ], None
    if residuals:
        named = ", ".join(residuals[:NAMED_RESIDUALS])
        more = len(residuals) - NAMED_RESIDUALS
        named += f" and {more} more" if more > 0 else ""
        return [f"residual child processes after shutdown: {named}"], Classification.RESOURCE_LEAK
    if leaks:
        return list(leaks), Classification.RESOURCE_LEAK
    return [], None


def _trainer_died(
    returncode: int | None, out_of_memory: str | None
) -> tuple[list[str], Classification | None]:
    if out_of_memory is not None:
        return [out_of_memory], Classification.OUT_OF_MEMORY
    if returncode is None:
        return ["trainer exit status is unknown"], None
    # The first real cause: a missing or abnormal run_summary is its evidence, not its class.
    return [f"trainer exited with returncode {returncode}"], Classification.TRAINER_FAILURE


def with_upload_error(verdict: Verdict, upload_error: str) -> Verdict:
    """The verdict once the upload failed: a pass becomes evidence_lost, a failure keeps its kind."""
    if verdict.status == "passed":
        reason = f"soak passed but its artifact was not uploaded: {upload_error}"
        return _failed(Classification.EVIDENCE_LOST, reason, upload_error)
    return replace(verdict, evidence_error=upload_error)
