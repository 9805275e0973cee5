"""The soak artifact: its document (``models``), the bounded-memory sample recorder
(``recorder``) and what it concludes from the samples (``analysis``)."""

from sidecar.core.artifact.analysis import leak_failures, project_memory, run_summary_figures, shm_finding
from sidecar.core.artifact.models import (
    PROVISIONAL_STATUSES,
    Artifact,
    AttemptPhasesInfo,
    CheckpointInfo,
    DeadlineInfo,
    LostAttempt,
    MonitorConfig,
    PhaseInfo,
    PostShutdown,
    ResourceSummary,
    Segment,
    UploadInfo,
    dumps_artifact,
    utc_timestamp,
)
from sidecar.core.artifact.recorder import SampleRecorder

__all__ = [
    "PROVISIONAL_STATUSES",
    "Artifact",
    "AttemptPhasesInfo",
    "CheckpointInfo",
    "DeadlineInfo",
    "LostAttempt",
    "MonitorConfig",
    "PhaseInfo",
    "PostShutdown",
    "ResourceSummary",
    "SampleRecorder",
    "Segment",
    "UploadInfo",
    "dumps_artifact",
    "leak_failures",
    "project_memory",
    "run_summary_figures",
    "shm_finding",
    "utc_timestamp",
]
