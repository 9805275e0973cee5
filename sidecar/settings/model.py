"""All configuration: one pydantic-settings model, env prefix ``SOAK_``, groups nested with ``__``.

Example: ``SOAK_MONITOR__SAMPLE_INTERVAL_S=2`` sets ``settings.monitor.sample_interval_s``.
Built once per command (the environment, then the command line's flags as the init source, which
wins) and passed down; nothing else reads the environment for configuration.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from sidecar.core.errors import ConfigError
from sidecar.settings.launcher import LauncherSettings
from sidecar.settings.outputs import (
    ArtifactSettings,
    EvidenceSettings,
    GpuSettings,
    KubeSettings,
    MetricsSettings,
    RedactionSettings,
    S3Settings,
)
from sidecar.settings.run import DeadlineSettings, MonitorSettings, SummarySettings


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
    evidence: EvidenceSettings = Field(default_factory=EvidenceSettings)
    redaction: RedactionSettings = Field(default_factory=RedactionSettings)
    s3: S3Settings = Field(default_factory=S3Settings)
    kube: KubeSettings = Field(default_factory=KubeSettings)
    gpu: GpuSettings = Field(default_factory=GpuSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)


def load_settings(
    flags: Mapping[str, object] | None = None,
    *,
    flag_names: Mapping[str, str] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Settings:
    """The settings from the environment and ``flags`` (``{"group.field": value}``, given on the
    command line: they win), validated together; one clear error line. ``flag_names`` says which
    flag set each of ``flags`` (``{"deadline.budget_s": "--budget"}``), so an error names what the
    user typed: the flag, else the environment variable as spelled, else the setting's path."""
    nested: dict[str, dict[str, object]] = {}
    for dotted, value in (flags or {}).items():
        group, name = dotted.split(".", 1)
        nested.setdefault(group, {})[name] = value
    try:
        return Settings(**nested)  # type: ignore[arg-type]
    except ValidationError as exc:
        names = _source_names(flags or {}, flag_names or {}, environ)
        problems = "; ".join(_problem(err["loc"], err["msg"], names) for err in exc.errors())
        raise ConfigError(f"invalid settings: {problems}") from exc
    except SettingsError as exc:
        # A list or object setting that is not JSON (SOAK_REDACTION__EXTRA_PATTERNS='['): pydantic-settings
        # fails before validation. Its cause says where in the text, never what the value holds.
        cause = f": {exc.__cause__}" if exc.__cause__ else ""
        raise ConfigError(f"invalid settings: {exc}{cause} (list and object settings are JSON)") from exc


def _group_fields() -> dict[str, tuple[str, ...]]:
    fields: dict[str, tuple[str, ...]] = {}
    for group, info in Settings.model_fields.items():
        model = info.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)  # every group is a model
        fields[group] = tuple(model.model_fields)
    return fields


def _source_names(
    flags: Mapping[str, object], flag_names: Mapping[str, str], environ: Mapping[str, str]
) -> dict[str, str]:
    """``group.field`` -> the flag or environment variable that set it (flags win, as in loading)."""
    by_upper = {key.upper(): key for key in environ}  # pydantic-settings matches env names in any case
    names: dict[str, str] = {}
    for group, fields in _group_fields().items():
        for field in fields:
            dotted = f"{group}.{field}"
            env = by_upper.get(f"SOAK_{group}__{field}".upper())
            if dotted in flags:
                names[dotted] = flag_names.get(dotted, dotted)
            elif env is not None:
                names[dotted] = env
    return names


def _problem(loc: tuple[int | str, ...], msg: str, names: Mapping[str, str]) -> str:
    """One validation error, every setting in it named as the user set it: a field's error led by
    its name; a group's cross-field rule (loc is the group) with each field it mentions renamed."""
    if not loc:
        return f"settings: {msg}"
    group = str(loc[0])
    if len(loc) == 1:
        fields = set(_group_fields().get(group, ()))

        def named(match: re.Match[str]) -> str:
            dotted = f"{group}.{match[0]}"
            return names.get(dotted, dotted) if match[0] in fields else match[0]

        # Only names with an underscore: a field called "backend" or "require" is also an English word.
        return f"{group}: " + re.sub(
            r"\b[a-z][a-z0-9]*_[a-z0-9_]*\b", named, msg.removeprefix("Value error, ")
        )
    dotted = f"{group}.{loc[1]}"
    return names.get(dotted, dotted) + "".join(f"[{part}]" for part in loc[2:]) + f": {msg}"


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
