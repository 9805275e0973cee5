"""Typed pydantic models of the run_summary contract, for its JSON Schema export.

Their validators run the explicit checks (``evaluate_parsed``, ``schema_failure``,
``shutdown_contract_failure``), so the models and the checks cannot drift.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, StrictStr, model_validator

from sidecar.core.run_summary.checks import schema_failure, shutdown_contract_failure, shutdown_diagnostics
from sidecar.core.run_summary.contract import finite_number
from sidecar.core.run_summary.evaluate import Profile, evaluate_parsed


def _json_integer(value: object) -> object:
    # 3.0 counts where an integer is wanted, True never does (as in contract.integer)
    if isinstance(value, bool):
        raise ValueError("a boolean is not an integer")
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def _json_finite(value: object) -> object:
    number = finite_number(value)
    if number is None:
        raise ValueError("must be a finite number")
    return number


def _object_or_none(value: object) -> object:
    # the checks treat a non-object here as if the field were absent
    return value if isinstance(value, Mapping) else None


# constraints sit inside the before-validator so they stay JSON Schema keywords
NonNegativeInt = Annotated[int, Strict(), Field(ge=0), BeforeValidator(_json_integer)]
PositiveInt = Annotated[int, Strict(), Field(gt=0), BeforeValidator(_json_integer)]
NonNegativeFinite = Annotated[float, Strict(), Field(ge=0), BeforeValidator(_json_finite)]
NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]
ShutdownClassification = Literal[
    "normal_completion",
    "learner_failure",
    "collector_failure",
    "backend_worker_failure",
    "timeout/stale_tick",
    "external_cancellation",
    "unknown_failure",
]


class _Open(BaseModel):
    # producers add fields freely; only the ones below are part of the soak contract
    model_config = ConfigDict(extra="allow", frozen=True)


class ShutdownException(_Open):
    type: StrictStr = Field(description="Exception class name.")
    message: StrictStr = Field(description="Exception message.")


class ShutdownCleanup(_Open):
    errors: list[Any] = Field(description="Cleanup errors; must be empty for a completed run.")


class ShutdownDiagnostics(_Open):
    """``runtime_manifest.shutdown``: the trainer's own diagnosis of how it ended."""

    classification: ShutdownClassification = Field(
        description="normal_completion for a completed run, never for an abnormal one."
    )
    owner: NonEmptyStr = Field(description="Component that owned the shutdown.")
    phase: NonEmptyStr = Field(description="Phase the run was in when it ended.")
    exception: ShutdownException | None = Field(None, description="The exception that ended it.")
    cleanup: ShutdownCleanup


class ReplayIngress(_Open):
    """``runtime_manifest.replay_ingress`` of a completed run: the final ingress queue state.

    Invariants: release_sequence <= published_sequence; occupancy = published_sequence -
    release_sequence, and 0 at the end; occupancy <= high_water_occupancy <= ingress_depth;
    high_water_occupancy > 0; early_returns = dropped_batches = closed_returns + stop_returns = 0;
    published_sequence = release_sequence = total_env_steps / ingress_slot_rows (exactly).
    """

    ingress_depth: PositiveInt
    ingress_slot_rows: PositiveInt
    published_sequence: NonNegativeInt
    release_sequence: NonNegativeInt
    occupancy: NonNegativeInt
    high_water_occupancy: PositiveInt
    backpressure_waits: NonNegativeInt
    backpressure_wait_s: NonNegativeFinite
    early_returns: NonNegativeInt
    dropped_batches: NonNegativeInt
    closed_returns: NonNegativeInt
    stop_returns: NonNegativeInt


class InferenceFlight(_Open):
    """``runtime_manifest.inference_flight``; a completed run must end drained."""

    queue_depth: Any = Field(None, description="Queued inference requests at the end: 0 or null.")
    publication_lag: Any = Field(None, description="Unpublished weights at the end: 0 or null.")
    max_in_flight: Any = Field(None, description="Informational (copied to the artifact).")
    max_publication_lag: Any = Field(None, description="Informational (copied to the artifact).")


class RuntimeManifest(_Open):
    """``runtime_manifest`` of a run that did not complete (only the schema and shutdown count)."""

    schema_version: Literal[2]
    shutdown: Annotated[ShutdownDiagnostics | None, BeforeValidator(_object_or_none)] = Field(
        None, description="Absent means 'shutdown diagnostics are unavailable'."
    )
    replay_ingress: Any = None
    inference_flight: Any = None
    inference_memory_budget: Any = None


class CompletedRuntimeManifest(_Open):
    """``runtime_manifest`` of a completed run."""

    schema_version: Literal[2]
    shutdown: Annotated[ShutdownDiagnostics, BeforeValidator(_object_or_none)] = Field(
        description="classification normal_completion and no cleanup errors."
    )
    replay_ingress: ReplayIngress
    inference_flight: Annotated[InferenceFlight | None, BeforeValidator(_object_or_none)] = None
    inference_memory_budget: Any = None


class CoreCompletedRuntimeManifest(_Open):
    """``runtime_manifest`` of a completed run under the core profile (any trainer)."""

    schema_version: Literal[2]
    shutdown: Annotated[ShutdownDiagnostics, BeforeValidator(_object_or_none)] = Field(
        description="classification normal_completion and no cleanup errors."
    )


def _completed_contract(data: object, profile: Profile = "replay") -> object:
    if isinstance(data, dict):
        if data.get("status") != "completed":
            raise ValueError("status must be 'completed'")
        outcome = evaluate_parsed(data, manifest_validator=None, profile=profile)
        if outcome.failures:
            raise ValueError(outcome.failure_reason)
    return data


def _core_completed_contract(data: object) -> object:
    return _completed_contract(data, "core")


def _abnormal_contract(data: object) -> object:
    if isinstance(data, dict):
        if data.get("status") == "completed":
            raise ValueError("status must not be 'completed'")
        problems = [
            problem
            for problem in (
                schema_failure(data, completed=False),
                shutdown_contract_failure(shutdown_diagnostics(data), require_normal_completion=False),
            )
            if problem is not None
        ]
        if problems:
            raise ValueError("; ".join(problems))
    return data


class CompletedRunSummary(_Open):
    """A completed run's summary that satisfies the whole soak contract."""

    status: Literal["completed"]
    metric_schema_version: Literal[1]
    total_env_steps: PositiveInt = Field(description="A multiple of ingress_slot_rows.")
    runtime_manifest: CompletedRuntimeManifest

    _contract = model_validator(mode="before")(_completed_contract)


class CoreCompletedRunSummary(_Open):
    """A completed run's summary under the core profile: status, schema versions, the shutdown record."""

    status: Literal["completed"]
    metric_schema_version: Literal[1]
    runtime_manifest: CoreCompletedRuntimeManifest

    _contract = model_validator(mode="before")(_core_completed_contract)


class AbnormalRunSummary(_Open):
    """The minimal summary of a run that did not complete (the run fails; the contract holds)."""

    status: Any = Field(
        None,
        description="Anything but 'completed' (e.g. 'failed').",
        json_schema_extra={"not": {"const": "completed"}},
    )
    metric_schema_version: Literal[1]
    runtime_manifest: RuntimeManifest

    _contract = model_validator(mode="before")(_abnormal_contract)
