"""run_summary.json (``contract``): the core profile's document, of the class that fits how the run
ended. The sidecar checks any claim in it against what it saw."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KIT_VERSION = "1"
NORMAL = "normal_completion"
STOPPED = "external_cancellation"
FAILED = "learner_failure"
# The document's own keys: a figure of the same name is not taken; likewise the manifest's.
RESERVED = frozenset({"status", "metric_schema_version", "runtime_manifest"})
MANIFEST_RESERVED = frozenset({"schema_version", "kit", "shutdown"})
MESSAGE_CHARS = 2000


def ending(*, stopping: bool, error: BaseException | None) -> str:
    """The class of the run's end: a stop (asked for or agreed) and what it caused are a cancellation,
    the trainer's own exception its failure."""
    if error is None:
        return STOPPED if stopping else NORMAL
    return STOPPED if stopping or isinstance(error, KeyboardInterrupt) else FAILED


def summary_document(
    *,
    figures: Mapping[str, Any],
    sections: Mapping[str, Any],
    classification: str,
    owner: str,
    phase: str,
    error: BaseException | None,
) -> dict[str, Any]:
    completed = classification == NORMAL
    exception = None
    if error is not None:
        exception = {"type": type(error).__name__, "message": str(error)[:MESSAGE_CHARS]}
    elif classification == STOPPED:
        exception = {"type": "SoftStop", "message": "stopped by the soft stop"}
    return {
        **{key: value for key, value in figures.items() if key not in RESERVED},
        "status": "completed" if completed else "failed",
        "metric_schema_version": 1,
        "runtime_manifest": {
            **{key: value for key, value in sections.items() if key not in MANIFEST_RESERVED},
            "schema_version": 2,
            "kit": {"name": "soak_sidecar_kit", "version": KIT_VERSION},
            "shutdown": {
                "classification": classification,
                "owner": owner,
                "phase": "final" if completed else phase,
                "exception": exception,
                "cleanup": {"errors": []},
            },
        },
    }
