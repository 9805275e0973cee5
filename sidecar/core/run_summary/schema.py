"""The JSON Schema (2020-12) of run_summary.json, exported for trainer authors."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, TypeAdapter

from sidecar.core.run_summary.contract import (
    SUPPORTED_METRIC_SCHEMA_VERSION,
    SUPPORTED_RUNTIME_MANIFEST_SCHEMA_VERSION,
)
from sidecar.core.run_summary.evaluate import Profile
from sidecar.core.run_summary.models import AbnormalRunSummary, CompletedRunSummary, CoreCompletedRunSummary

RunSummary = Annotated[CompletedRunSummary | AbnormalRunSummary, Field(union_mode="left_to_right")]
CoreRunSummary = Annotated[CoreCompletedRunSummary | AbnormalRunSummary, Field(union_mode="left_to_right")]
_RUN_SUMMARY: TypeAdapter[CompletedRunSummary | AbnormalRunSummary] = TypeAdapter(RunSummary)
_CORE_RUN_SUMMARY: TypeAdapter[CoreCompletedRunSummary | AbnormalRunSummary] = TypeAdapter(CoreRunSummary)
_COMPLETED = {
    "replay": (
        "total_env_steps and a runtime_manifest with schema_version "
        f"{SUPPORTED_RUNTIME_MANIFEST_SCHEMA_VERSION}, replay_ingress and shutdown"
    ),
    "core": (
        f"a runtime_manifest with schema_version {SUPPORTED_RUNTIME_MANIFEST_SCHEMA_VERSION} and shutdown"
    ),
}


def run_summary_json_schema(profile: Profile = "replay") -> dict[str, Any]:
    """JSON Schema (2020-12) of run_summary.json under ``profile``, for trainer authors."""
    schema = (_CORE_RUN_SUMMARY if profile == "core" else _RUN_SUMMARY).json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"soak-sidecar run_summary.json ({profile} profile)",
        "description": (
            "Written by the trainer into the progress directory when it ends. A completed run "
            f"(status 'completed') needs metric_schema_version {SUPPORTED_METRIC_SCHEMA_VERSION}, "
            f"{_COMPLETED[profile]}; any other status fails the soak with the trainer's shutdown "
            "classification."
        ),
        **schema,
    }
