"""The checks of the schema versions, the shutdown diagnostics and the inference flight, one
function each, each with fixed message texts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.core.run_summary.contract import (
    SHUTDOWN_CLASSIFICATIONS,
    SUPPORTED_METRIC_SCHEMA_VERSION,
    SUPPORTED_RUNTIME_MANIFEST_SCHEMA_VERSION,
    finite_number,
    mapping,
    show,
)


def schema_failure(summary: Mapping[str, Any], *, completed: bool) -> str | None:
    """Producer schema versions, for both normal and minimal failure summaries."""
    scope = "completed " if completed else ""
    metric_schema_version = summary.get("metric_schema_version")
    if metric_schema_version is None:
        return f"{scope}run_summary is missing metric_schema_version"
    if (
        isinstance(metric_schema_version, bool)
        or not isinstance(metric_schema_version, int)
        or metric_schema_version != SUPPORTED_METRIC_SCHEMA_VERSION
    ):
        return (
            f"{scope}run_summary has unsupported metric_schema_version "
            f"{show(metric_schema_version)}; expected {SUPPORTED_METRIC_SCHEMA_VERSION}"
        )
    manifest = mapping(summary.get("runtime_manifest"))
    if manifest is None:
        return f"{scope}run_summary is missing runtime_manifest"
    runtime_schema_version = manifest.get("schema_version")
    if runtime_schema_version is None:
        return f"{scope}runtime_manifest is missing runtime_manifest.schema_version"
    if (
        isinstance(runtime_schema_version, bool)
        or not isinstance(runtime_schema_version, int)
        or runtime_schema_version != SUPPORTED_RUNTIME_MANIFEST_SCHEMA_VERSION
    ):
        return (
            f"{scope}runtime_manifest has unsupported runtime_manifest.schema_version "
            f"{show(runtime_schema_version)}; expected "
            f"{SUPPORTED_RUNTIME_MANIFEST_SCHEMA_VERSION}"
        )
    return None


def shutdown_diagnostics(summary: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``runtime_manifest.shutdown`` when it is an object; anything else counts as absent."""
    if summary is None:
        return None
    manifest = mapping(summary.get("runtime_manifest"))
    if manifest is None:
        return None
    return mapping(manifest.get("shutdown"))


def shutdown_contract_failure(
    shutdown: Mapping[str, Any] | None, *, require_normal_completion: bool
) -> str | None:
    """The durable, host-only shutdown fields the soak consumes."""
    if shutdown is None:
        return (
            "completed runtime_manifest is missing shutdown diagnostics"
            if require_normal_completion
            else None
        )
    return (
        _shutdown_identity_failure(shutdown)
        or _shutdown_details_failure(shutdown)
        or _shutdown_outcome_failure(shutdown, require_normal_completion=require_normal_completion)
    )


def _shutdown_identity_failure(shutdown: Mapping[str, Any]) -> str | None:
    classification = shutdown.get("classification")
    owner = shutdown.get("owner")
    phase = shutdown.get("phase")
    if not isinstance(classification, str) or classification not in SHUTDOWN_CLASSIFICATIONS:
        return f"shutdown has invalid classification {show(classification)}"
    if not isinstance(owner, str) or not owner:
        return f"shutdown has invalid owner {show(owner)}"
    if not isinstance(phase, str) or not phase:
        return f"shutdown has invalid phase {show(phase)}"
    return None


def _shutdown_details_failure(shutdown: Mapping[str, Any]) -> str | None:
    exception = shutdown.get("exception")
    if exception is not None and not isinstance(exception, Mapping):
        return f"shutdown has invalid exception {show(exception)}"
    if isinstance(exception, Mapping) and (
        not isinstance(exception.get("type"), str) or not isinstance(exception.get("message"), str)
    ):
        return "shutdown exception requires string type and message fields"
    cleanup = shutdown.get("cleanup")
    if not isinstance(cleanup, Mapping):
        return f"shutdown has invalid cleanup {show(cleanup)}"
    if not isinstance(cleanup.get("errors"), list):
        return "shutdown cleanup.errors must be a list"
    return None


def _shutdown_outcome_failure(shutdown: Mapping[str, Any], *, require_normal_completion: bool) -> str | None:
    """Whether the (well-formed) shutdown matches how the run ended."""
    classification = shutdown.get("classification")
    if not require_normal_completion:
        if classification == "normal_completion":
            return "abnormal run shutdown classification cannot be normal_completion"
        return None
    if classification != "normal_completion":
        return f"completed run shutdown classification must be normal_completion, got {show(classification)}"
    cleanup_errors = shutdown["cleanup"]["errors"]
    if cleanup_errors:
        return f"completed run reported shutdown cleanup errors: {show(cleanup_errors)}"
    return None


def describe_shutdown(shutdown: Mapping[str, Any]) -> str:
    """One line naming the trainer's own diagnosis of an abnormal run."""
    exception = shutdown.get("exception")
    exception_text = ""
    if isinstance(exception, Mapping):
        exception_text = f", exception={show(exception.get('type'))}: {show(exception.get('message'))}"
    cleanup = shutdown.get("cleanup")
    cleanup_count = ""
    if isinstance(cleanup, Mapping) and isinstance(cleanup.get("errors"), list):
        cleanup_count = f", cleanup_errors={len(cleanup['errors'])}"
    return (
        "shutdown classification="
        f"{show(shutdown.get('classification'))}, owner={show(shutdown.get('owner'))}, "
        f"phase={show(shutdown.get('phase'))}{exception_text}{cleanup_count}"
    )


def _drained(value: object) -> bool:
    if value is None:
        return True
    number = finite_number(value)
    return number is not None and number == 0


def inference_flight_failure(summary: Mapping[str, Any]) -> str | None:
    """A completed run must end with no queued inference and no unpublished weights."""
    manifest = mapping(summary.get("runtime_manifest"))
    flight = mapping(manifest.get("inference_flight")) if manifest is not None else None
    if flight is None:
        return None
    queue_depth = flight.get("queue_depth")
    publication_lag = flight.get("publication_lag")
    if _drained(queue_depth) and _drained(publication_lag):
        return None
    return (
        "final inference flight is not drained: "
        f"queue_depth={show(queue_depth)}, publication_lag={show(publication_lag)}"
    )
