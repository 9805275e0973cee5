"""The launcher's group: the run-dir protocol between sidecar and launcher."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from sidecar.launcher.protocol.fields import signal_number
from sidecar.launcher.protocol.names import DEFAULT_EXIT_GRACE_S, MAX_EXIT_GRACE_S
from sidecar.settings.base import DAY_S, MAX_BYTES, MAX_SECONDS, MIN_INTERVAL_S, Group


class LauncherSettings(Group):
    """The run-dir protocol between sidecar and launcher."""

    run_dir: Path = Field(
        Path("soak-output/run"),
        description="Run dir shared with the launcher. Default <output>/runs/<run id>/run locally, "
        "/soak/run in the chart.",
    )
    heartbeat_interval_s: float = Field(
        1.0, ge=MIN_INTERVAL_S, le=DAY_S, description="Sidecar heartbeat period, seconds. Default 1."
    )
    heartbeat_timeout_s: float = Field(
        15.0,
        gt=0,
        le=DAY_S,
        description="Launcher kills the trainer after this long without a heartbeat. Default 15.",
    )
    appear_timeout_s: float = Field(
        300.0, gt=0, le=MAX_SECONDS, description="Seconds the sidecar waits for launcher.json. Default 300."
    )
    go_timeout_s: float = Field(
        300.0, gt=0, le=MAX_SECONDS, description="Seconds the launcher waits for go.json. Default 300."
    )
    kill_grace_s: float = Field(
        5.0, ge=0, le=DAY_S, description="Seconds between TERM and KILL when stopping survivors. Default 5."
    )
    exit_grace_s: float = Field(
        DEFAULT_EXIT_GRACE_S,
        ge=0,
        le=MAX_EXIT_GRACE_S,
        description="After the trainer exits on its own (no stop sent): seconds its remaining "
        "descendants get to exit by themselves, reaped as they do, never past the deadline's TERM; only "
        "what still runs then is a survivor (TERM, KILL after kill_grace_s; a resource leak). A rank still "
        "exiting when rank 0 ends is no leak. 0: at once. At most 60. Default 5.",
    )
    console_log_bytes: int = Field(
        64 * 1024 * 1024, gt=0, le=MAX_BYTES, description="Cap of the console log, bytes. Default 64 MiB."
    )
    soft_stop_signal: str = Field(
        "SIGUSR1", description="Signal sent to the trainer group at the margin. Default SIGUSR1."
    )
    stop_grace_s: float = Field(
        30.0,
        ge=0,
        le=DAY_S,
        description="A soak stopped from outside (the pod deleted, its Job failed, Ctrl-C, SIGTERM): "
        "seconds the trainer gets after the soft stop to checkpoint and exit before SIGTERM; 0 sends "
        "SIGTERM at once; a second stop signal ends the grace at once. Keep it well inside the pod's "
        "terminationGracePeriodSeconds. Default 30 in a pod, 5 for run --local.",
    )

    keep_env: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Local mode: variables of the sidecar's environment a trainer still gets, named "
        "exactly. The rest of SOAK_*, AWS_*, KUBECONFIG and BOTO_CONFIG, in any case (the sidecar's "
        "settings and credentials), are withheld. JSON list. Default [].",
    )

    @model_validator(mode="after")
    def _beats_within_timeout(self) -> LauncherSettings:
        # The launcher kills the trainer when the newest beat is older than the timeout: a period
        # not below it loses the supervisor between two healthy beats.
        if self.heartbeat_interval_s >= self.heartbeat_timeout_s:
            raise ValueError(
                f"heartbeat_interval_s ({self.heartbeat_interval_s:g} s) must be smaller than "
                f"heartbeat_timeout_s ({self.heartbeat_timeout_s:g} s): the launcher would kill the "
                "trainer as supervisor_lost between two beats"
            )
        return self

    @field_validator("soft_stop_signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        # The launcher's own parser (it reads this value from go.json), so the two cannot disagree;
        # a name it cannot use is refused before any record exists.
        signal_number(value)
        return value
