"""The pluggable generic runtime-manifest validator (``sidecar.adapters.validators`` loads it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sidecar.core.run_summary.contract import SUPPORTED_RUNTIME_MANIFEST_SCHEMA_VERSION, clip, mapping

_MANIFEST_VERSION_TEXT = f"v{SUPPORTED_RUNTIME_MANIFEST_SCHEMA_VERSION}"


class ManifestValidator(Protocol):
    """Called as ``validator(manifest, completed=bool)``; raises TypeError/ValueError if violated.

    It receives the summary's own ``runtime_manifest`` object and must not modify it.
    """

    def __call__(self, manifest: Mapping[str, Any], /, *, completed: bool) -> None: ...


@dataclass(frozen=True)
class ValidatorUnavailable:
    """A configured validator that could not be loaded: every validation reports ``message``."""

    message: str


def manifest_contract_failure(
    summary: Mapping[str, Any],
    *,
    completed: bool,
    validator: ManifestValidator | ValidatorUnavailable | None,
) -> str | None:
    """The generic producer validator (skipped when none is configured)."""
    manifest = mapping(summary.get("runtime_manifest"))
    if manifest is None or validator is None:
        return None
    if isinstance(validator, ValidatorUnavailable):
        return validator.message
    try:
        validator(manifest, completed=completed)
    except (TypeError, ValueError) as exc:
        return f"runtime_manifest violates {_MANIFEST_VERSION_TEXT} contract: {clip(str(exc))}"
    except Exception as exc:  # a crashing plug-in is a failed validation, never a lost verdict
        return f"runtime_manifest validator failed: {type(exc).__name__}: {clip(str(exc))}"
    return None
