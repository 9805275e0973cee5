"""Judging a run_summary: its classification from the summary alone, and its outcome.

The generic runtime-manifest validator runs only after the replay-ingress checks pass, so a
generic schema error cannot hide the actionable replay-ingress one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from sidecar.core.classification import Classification, Finding, Source
from sidecar.core.errors import InvalidRunSummaryError
from sidecar.core.run_summary.checks import (
    describe_shutdown,
    inference_flight_failure,
    schema_failure,
    shutdown_contract_failure,
    shutdown_diagnostics,
)
from sidecar.core.run_summary.contract import show
from sidecar.core.run_summary.ingress import replay_ingress_failure
from sidecar.core.run_summary.parse import load_run_summary
from sidecar.core.run_summary.validator import (
    ManifestValidator,
    ValidatorUnavailable,
    manifest_contract_failure,
)

# Which rules a completed run_summary meets, chosen by the operator (never by the trainer):
# "core" any trainer can meet (status, schema versions, the shutdown contract, the manifest
# validator); "replay" adds the replay-ingress invariants and drained inference flight, whole.
Profile = Literal["core", "replay"]


@dataclass(frozen=True)
class SummaryOutcome:
    """What ``run_summary.json`` alone says about the run.

    ``findings`` are the checks' findings in their fixed order: the contract's, checked by the
    sidecar, and the trainer's own account of its failure (its shutdown record, ``Source.TRAINER``);
    ``classification`` is the failure kind had nothing failed before the summary was read. Two
    rules depend on earlier failures, so ``verdict.judge`` composes them through ``reason_parts``
    and ``classification_overrides``: the "status is X, expected 'completed'" message (then
    always the first, ``status_first``) is reported only when nothing failed before, and a valid
    abnormal shutdown classification from the trainer is its claim, weighed against what the
    sidecar established (``sidecar.core.verdict``).
    """

    present: bool
    data: dict[str, Any] | None
    classification: Classification | None
    shutdown: Mapping[str, Any] | None = None
    findings: tuple[Finding, ...] = ()
    status_first: bool = False
    classification_overrides: bool = False
    completed: bool = False

    @property
    def failures(self) -> tuple[str, ...]:
        return tuple(found.reason for found in self.findings)

    @property
    def failure_reason(self) -> str | None:
        return "; ".join(self.failures) if self.findings else None

    @property
    def passed(self) -> bool:
        return not self.findings

    def reason_parts(self, *, after_failure: bool) -> tuple[str, ...]:
        """The messages to append to a reason; ``after_failure``: something failed already."""
        return self.failures[1:] if after_failure and self.status_first else self.failures


def unreadable(kind: Classification, reason: str, *, present: bool = True) -> SummaryOutcome:
    """A run_summary that could not be judged at all: missing, stale, unreadable, not JSON."""
    return SummaryOutcome(
        present=present, data=None, classification=kind, findings=(Finding(kind, reason, Source.CONTRACT),)
    )


def _utc(epoch: float) -> str:
    try:
        return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    except (OverflowError, OSError, ValueError):
        return repr(epoch)


def evaluate_run_summary(
    raw: bytes | None,
    *,
    mtime: float | None,
    run_started_wall: float | None,
    max_bytes: int,
    manifest_validator: ManifestValidator | ValidatorUnavailable | None,
    profile: Profile = "replay",
) -> SummaryOutcome:
    """Judge the file's bytes; ``raw`` None: it does not exist. Never raises for any input.

    ``mtime``/``run_started_wall`` (epoch seconds): a file last written before the run started
    is left over from an earlier attempt. Pass None for either to skip that check (offline).
    """
    if raw is None:
        missing = "trainer did not write run_summary.json"
        return unreadable(Classification.MISSING_RUN_SUMMARY, missing, present=False)
    if mtime is not None and run_started_wall is not None and mtime < run_started_wall:
        return unreadable(
            Classification.STALE_RUN_SUMMARY,
            f"run_summary.json predates this run (written {_utc(mtime)}, run started "
            f"{_utc(run_started_wall)}): left over from an earlier attempt",
        )
    try:
        value = load_run_summary(raw, max_bytes=max_bytes)
    except InvalidRunSummaryError as exc:
        return unreadable(Classification.INVALID_RUN_SUMMARY, str(exc))
    return evaluate_parsed(value, manifest_validator=manifest_validator, profile=profile)


def evaluate_parsed(
    value: object,
    *,
    manifest_validator: ManifestValidator | ValidatorUnavailable | None,
    profile: Profile = "replay",
) -> SummaryOutcome:
    """Judge an already parsed document (its classification, from the summary alone)."""
    if not isinstance(value, dict):
        not_object = f"run_summary must be a JSON object, got {type(value).__name__}"
        return unreadable(Classification.INVALID_RUN_SUMMARY, not_object)
    summary: dict[str, Any] = value
    completed = summary.get("status") == "completed"
    shutdown = shutdown_diagnostics(summary)
    found = _Findings()
    schema = schema_failure(summary, completed=completed)
    found.add(Classification.SCHEMA_VIOLATION, schema)
    if completed:
        _judge_completed(
            found, summary, shutdown, schema_ok=schema is None, validator=manifest_validator, profile=profile
        )
    else:
        _judge_abnormal(found, summary, shutdown, validator=manifest_validator)
    return SummaryOutcome(
        present=True,
        data=summary,
        classification=found.kind or (Classification.UNKNOWN_FAILURE if found.findings else None),
        shutdown=shutdown,
        findings=tuple(found.findings),
        status_first=found.status_first,
        classification_overrides=found.overrides,
        completed=completed,
    )


@dataclass
class _Findings:
    """What ``evaluate_parsed`` has found so far; the first failure with a kind classifies."""

    findings: list[Finding] = field(default_factory=list)
    kind: Classification | None = None
    status_first: bool = False
    overrides: bool = False

    def add(self, kind: Classification | None, message: str | None) -> None:
        """A contract check's message, if it failed; a check that names no class is ``unknown_failure``."""
        if message is not None:
            named = Classification.UNKNOWN_FAILURE if kind is None else kind
            self.findings.append(Finding(named, message, Source.CONTRACT, provisional=kind is None))
            self.kind = self.kind or kind


def _judge_completed(
    found: _Findings,
    summary: Mapping[str, Any],
    shutdown: Mapping[str, Any] | None,
    *,
    schema_ok: bool,
    validator: ManifestValidator | ValidatorUnavailable | None,
    profile: Profile,
) -> None:
    replay = profile == "replay"
    if schema_ok and replay:
        found.add(Classification.UNKNOWN_FAILURE, inference_flight_failure(summary))
    ingress = (replay_ingress_failure(summary) if replay else None) or manifest_contract_failure(
        summary, completed=True, validator=validator
    )
    found.add(Classification.SCHEMA_VIOLATION, ingress)
    found.add(
        Classification.SHUTDOWN_CONTRACT_VIOLATION,
        shutdown_contract_failure(shutdown, require_normal_completion=True),
    )


def _judge_abnormal(
    found: _Findings,
    summary: Mapping[str, Any],
    shutdown: Mapping[str, Any] | None,
    *,
    validator: ManifestValidator | ValidatorUnavailable | None,
) -> None:
    if not found.findings:
        found.status_first = True
        found.add(None, f"run_summary status is {show(summary.get('status'))}, expected 'completed'")
    found.add(None, manifest_contract_failure(summary, completed=False, validator=validator))
    contract = shutdown_contract_failure(shutdown, require_normal_completion=False)
    if contract is not None:
        found.add(Classification.SHUTDOWN_CONTRACT_VIOLATION, contract)
    elif shutdown is not None:
        # the contract held, so the classification is one of the six abnormal ones: the trainer's
        claim = Classification(str(shutdown.get("classification")))
        found.findings.append(Finding(claim, describe_shutdown(shutdown), Source.TRAINER))
        found.kind = claim
        found.overrides = True
    else:
        found.add(None, "shutdown diagnostics are unavailable")
