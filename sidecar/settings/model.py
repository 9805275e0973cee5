"""All configuration: one pydantic-settings model, env prefix ``SOAK_``, groups nested with ``__``.

Example: ``SOAK_MONITOR__SAMPLE_INTERVAL_S=2`` sets ``settings.monitor.sample_interval_s``.
Built once per command (the environment, then the command line's flags as the init source, which
wins) and passed down; nothing else reads the environment for configuration.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from sidecar.core.errors import ConfigError
from sidecar.settings.outputs import (
    ArtifactSettings,
    GpuSettings,
    KubeSettings,
    MetricsSettings,
    RedactionSettings,
    S3Settings,
)
from sidecar.settings.run import DeadlineSettings, LauncherSettings, MonitorSettings, SummarySettings


class Settings(BaseSettings):
    """Everything soak-sidecar can be told. Env: ``SOAK_<GROUP>__<FIELD>``."""

    model_config = SettingsConfigDict(
        env_prefix="SOAK_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_assignment=True,
    )

    monitor: MonitorSettings = Field(default_factory=MonitorSettings)
    summary: SummarySettings = Field(default_factory=SummarySettings)
    deadline: DeadlineSettings = Field(default_factory=DeadlineSettings)
    launcher: LauncherSettings = Field(default_factory=LauncherSettings)
    artifact: ArtifactSettings = Field(default_factory=ArtifactSettings)
    redaction: RedactionSettings = Field(default_factory=RedactionSettings)
    s3: S3Settings = Field(default_factory=S3Settings)
    kube: KubeSettings = Field(default_factory=KubeSettings)
    gpu: GpuSettings = Field(default_factory=GpuSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)


def load_settings(flags: Mapping[str, object] | None = None) -> Settings:
    """The settings from the environment and ``flags`` (``{"group.field": value}``, given on the
    command line: they win), validated together; one clear error line."""
    nested: dict[str, dict[str, object]] = {}
    for dotted, value in (flags or {}).items():
        group, name = dotted.split(".", 1)
        nested.setdefault(group, {})[name] = value
    try:
        return Settings(**nested)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid settings: {problems}") from exc
    except SettingsError as exc:
        # A list or object setting that is not JSON (SOAK_REDACTION__EXTRA_PATTERNS='['): pydantic-settings
        # fails before validation. Its cause says where in the text, never what the value holds.
        cause = f": {exc.__cause__}" if exc.__cause__ else ""
        raise ConfigError(f"invalid settings: {exc}{cause} (list and object settings are JSON)") from exc


def explicit_settings(settings: Settings) -> frozenset[str]:
    """The fields the user set (environment or flags), as ``group.field``; the rest are defaults."""
    return frozenset(
        f"{group}.{name}"
        for group in Settings.model_fields
        for name in getattr(settings, group).model_fields_set
    )


def with_defaults(settings: Settings, defaults: Mapping[str, object]) -> Settings:
    """``settings`` with ``defaults`` (``{"group.field": value}``) for the fields the user left
    unset: a mode's own defaults, below the environment and the flags. Only the touched groups are
    validated again."""
    given = explicit_settings(settings)
    updates: dict[str, dict[str, object]] = {}
    for dotted, value in defaults.items():
        if dotted not in given:
            group, name = dotted.split(".", 1)
            updates.setdefault(group, {})[name] = value
    try:
        groups = {
            group: type(getattr(settings, group)).model_validate(
                {**getattr(settings, group).model_dump(exclude_unset=True), **values}
            )
            for group, values in updates.items()
        }
    except ValidationError as exc:
        raise ConfigError(f"invalid settings: {exc.errors()[0]['msg']}") from exc
    return settings.model_copy(update=groups)


def pod_release_paths(environ: Mapping[str, str] = os.environ) -> tuple[Path, Path]:
    """The run dir and termination log as configured, read without validating the rest: what a pod
    sidecar whose settings failed to build still needs, to end its waiting launcher and say why."""
    run_dir = environ.get("SOAK_LAUNCHER__RUN_DIR") or LauncherSettings.model_fields["run_dir"].default
    log = environ.get("SOAK_KUBE__TERMINATION_LOG") or KubeSettings.model_fields["termination_log"].default
    return Path(run_dir), Path(log)
