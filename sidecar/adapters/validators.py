"""Loads the generic runtime-manifest validator plug-in: ``module:function`` or an entry point.

Loading runs the plug-in module's code, so it happens here; the core only calls what this returns
(``sidecar.core.run_summary.ManifestValidator``) or reports why it is unavailable.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points

from sidecar.core.errors import ConfigError
from sidecar.core.run_summary import ManifestValidator, ValidatorUnavailable, clip

DEFAULT_VALIDATOR_GROUP = "soak_sidecar.manifest_validators"


def _load_validator(target: str, load: Callable[[], object]) -> ManifestValidator | ValidatorUnavailable:
    try:
        func = load()
    except ImportError as exc:
        return ValidatorUnavailable(f"runtime_manifest validation requires {target}: {exc}")
    except Exception as exc:  # a broken plug-in module fails validation, not the sidecar
        return ValidatorUnavailable(
            f"runtime_manifest validation requires {target}: {type(exc).__name__}: {exc}"
        )
    if not callable(func):
        return ValidatorUnavailable(
            f"runtime_manifest validation requires {target}: {clip(repr(func))} is not callable"
        )
    validator: ManifestValidator = func
    return validator


def _import_attribute(module_name: str, attribute: str) -> object:
    value: object = importlib.import_module(module_name)
    for part in attribute.split("."):
        value = getattr(value, part)
    return value


def resolve_manifest_validator(
    spec: str | None, *, entry_point_group: str = DEFAULT_VALIDATOR_GROUP
) -> ManifestValidator | ValidatorUnavailable | None:
    """The generic runtime-manifest validator to run, from ``module:function`` or an entry point.

    ``None``: nothing configured (the generic step is skipped). ``ValidatorUnavailable``: it is
    configured but cannot be loaded, which fails every validation (never skipped silently). Raises
    ``ConfigError`` for a malformed spec or an ambiguous entry point group.
    """
    if spec is not None:
        module_name, sep, attribute = spec.partition(":")
        if not sep or not module_name.strip() or not attribute.strip():
            raise ConfigError(f"summary.manifest_validator must be 'module:function', got {spec!r}")
        return _load_validator(spec, lambda: _import_attribute(module_name.strip(), attribute.strip()))
    found = sorted(entry_points(group=entry_point_group), key=lambda ep: ep.name)
    if not found:
        return None
    if len(found) > 1:
        names = ", ".join(f"{ep.name} ({ep.value})" for ep in found)
        raise ConfigError(
            f"several runtime_manifest validators in entry point group {entry_point_group!r}: "
            f"{names}; choose one with summary.manifest_validator"
        )
    return _load_validator(found[0].value, found[0].load)
