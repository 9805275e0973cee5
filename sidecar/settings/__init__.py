"""All configuration: one pydantic-settings model (``model.py``) of groups (``run.py``,
``outputs.py``), env prefix ``SOAK_``, groups nested with ``__``."""

from sidecar.settings.launcher import LauncherSettings
from sidecar.settings.model import (
    Settings,
    explicit_settings,
    load_settings,
    pod_release_paths,
    with_defaults,
)
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

__all__ = [
    "ArtifactSettings",
    "DeadlineSettings",
    "EvidenceSettings",
    "GpuSettings",
    "KubeSettings",
    "LauncherSettings",
    "MetricsSettings",
    "MonitorSettings",
    "RedactionSettings",
    "S3Settings",
    "Settings",
    "SummarySettings",
    "explicit_settings",
    "load_settings",
    "pod_release_paths",
    "with_defaults",
]
