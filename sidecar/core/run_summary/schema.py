"""The JSON Schema (2020-12) of run_summary.json, exported for trainer authors."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, TypeAdapter

from sidecar.core.run_summary.contract import (
    SUPPORTED_METRIC_SCHEMA_VERSION,
    SUPPORTED_RUNTIME_MANIFEST_SCHEMA_VERSION,
)
from sidecar.core.run_summary.models import AbnormalRunSummary, CompletedRunSummary

RunSummary = Annotated[CompletedRunSummary | AbnormalRunSummary, Field(union_mode="left_to_right")]
_RUN_SUMMARY: TypeAdapter[CompletedRunSummary | AbnormalRunSummary] = TypeAdapter(RunSummary)


def run_summary_json_schema() -> dict[str, Any]:
    """JSON Schema (2020-12) of run_summary.json, for trainer authors."""
    schema = _RUN_SUMMARY.json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "soak-sidecar run_summary.json",
        "description": (
            "Written by the trainer into the progress directory when it ends. A completed run "
            f"(status 'completed') needs metric_schema_version {SUPPORTED_METRIC_SCHEMA_VERSION}, "
            "total_env_steps and a runtime_manifest with schema_version "
            f"{SUPPORTED_RUNTIME_MANIFEST_SCHEMA_VERSION}, replay_ingress and shutdown; any other "
            "status fails the soak with the trainer's shutdown classification."
        ),
        **schema,
    }
