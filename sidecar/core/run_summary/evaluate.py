"""Judging a run_summary: its classification from the summary alone, and its outcome.

The generic runtime-manifest validator runs only after the replay-ingress checks pass, so a
generic schema error cannot hide the actionable replay-ingress one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from sidecar.core.classification import Classification
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

    ``failures`` are the checks' messages in their fixed order; ``classification`` is the
    failure kind had nothing failed before the summary was read. Two rules
    depend on earlier failures, so ``verdict.decide`` composes them through ``reason_parts`` and
    ``classification_overrides``: the "status is X, expected 'completed'" message (kept in
    ``status_failure``, then always ``failures[0]``) is reported only when nothing failed before,
    and a valid abnormal shutdown classification from the trainer replaces any earlier kind.
    """

    present: bool
    data: dict[str, Any] | None
    classification: Classification | None
    shutdown: Mapping[str, Any] | None = None
    failures: tuple[str, ...] = ()
    status_failure: str | None = None
    classification_overrides: bool = False
    completed: bool = False

    @property
    def failure_reason(self) -> str | None:
        return "; ".join(self.failures) if self.failures else None

    @property
    def passed(self) -> bool:
        return not self.failures

    def reason_parts(self, *, after_failure: bool) -> tuple[str, ...]:
        """The messages to append to a reason; ``after_failure``: something failed already."""
        if after_failure and self.status_failure is not None:
            return self.failures[1:]
        return self.failures


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
        return SummaryOutcome(
            present=False,
            data=None,
            classification=Classification.MISSING_RUN_SUMMARY,
            failures=("trainer did not write run_summary.json",),
        )
    if mtime is not None and run_started_wall is not None and mtime < run_started_wall:
        return SummaryOutcome(
            present=True,
            data=None,
            classification=Classification.STALE_RUN_SUMMARY,
            failures=(
                f"run_summary.json predates this run (written {_utc(mtime)}, run started "
                f"{_utc(run_started_wall)}): left over from an earlier attempt",
            ),
        )
    try:
        value = load_run_summary(raw, max_bytes=max_bytes)
    except InvalidRunSummaryError as exc:
        return SummaryOutcome(
            present=True, data=None, classification=Classification.INVALID_RUN_SUMMARY, failures=(str(exc),)
        )
    return evaluate_parsed(value, manifest_validator=manifest_validator, profile=profile)


def evaluate_parsed(
    value: object,
    *,
    manifest_validator: ManifestValidator | ValidatorUnavailable | None,
    profile: Profile = "replay",
) -> SummaryOutcome:
    """Judge an already parsed document (its classification, from the summary alone)."""
    if not isinstance(value, dict):
        return SummaryOutcome(
            present=True,
            data=None,
            classification=Classification.INVALID_RUN_SUMMARY,
            failures=(f"run_summary must be a JSON object, got {type(value).__name__}",),
        )
    summary: dict[str, Any] = value
    completed = summary.get("status") == "completed"
    shutdown = shutdown_diagnostics(summary)
    found = _Findings()
    schema = schema_failure(summary, completed=completed)
    found.add(schema, Classification.SCHEMA_VIOLATION)
    if completed:
        _judge_completed(
            found, summary, shutdown, schema_ok=schema is None, validator=manifest_validator, profile=profile
        )
    else:
        _judge_abnormal(found, summary, shutdown, validator=manifest_validator)
    return SummaryOutcome(
        present=True,
        data=summary,
        classification=found.kind or (Classification.UNKNOWN_FAILURE if found.failures else None),
        shutdown=shutdown,
        failures=tuple(found.failures),
        status_failure=found.status_failure,
        classification_overrides=found.overrides,
        completed=completed,
    )


@dataclass
class _Findings:
    """What ``evaluate_parsed`` has found so far; the first failure with a kind classifies."""

    failures: list[str] = field(default_factory=list)
    kind: Classification | None = None
    status_failure: str | None = None
    overrides: bool = False

    def add(self, failure: str | None, kind: Classification | None = None) -> None:
        if failure is not None:
            self.failures.append(failure)
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
        found.add(inference_flight_failure(summary), Classification.UNKNOWN_FAILURE)
    ingress = (replay_ingress_failure(summary) if replay else None) or manifest_contract_failure(
        summary, completed=True, validator=validator
    )
    found.add(ingress, Classification.SCHEMA_VIOLATION)
    found.add(
        shutdown_contract_failure(shutdown, require_normal_completion=True),
        Classification.SHUTDOWN_CONTRACT_VIOLATION,
    )


def _judge_abnormal(
    found: _Findings,
    summary: Mapping[str, Any],
    shutdown: Mapping[str, Any] | None,
    *,
    validator: ManifestValidator | ValidatorUnavailable | None,
) -> None:
    if not found.failures:
        found.status_failure = f"run_summary status is {show(summary.get('status'))}, expected 'completed'"
        found.add(found.status_failure)
    found.add(manifest_contract_failure(summary, completed=False, validator=validator))
    contract = shutdown_contract_failure(shutdown, require_normal_completion=False)
    if contract is not None:
        found.add(contract, Classification.SHUTDOWN_CONTRACT_VIOLATION)
    elif shutdown is not None:
        found.add(describe_shutdown(shutdown))
        # the contract held, so the classification is one of the six abnormal ones
        found.kind = Classification(str(shutdown.get("classification")))
        found.overrides = True
    else:
        found.add("shutdown diagnostics are unavailable")
