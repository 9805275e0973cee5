"""The artifact's account of the trainer's structured progress (progress.jsonl): where it got, how
fast, the finish against the deadline, whether it slows down, its phases' timeouts."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sidecar.core.phase_timeouts import PhaseTimeout
from sidecar.core.trends import LeakTrend


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProgressInfo(_Model):
    """Where the trainer's structured progress records (progress.jsonl) last put it, and the finish
    they let the sidecar estimate (sidecar.core.eta)."""

    step: int | None = None
    total_steps: int | None = Field(None, description="The total the trainer declared.")
    phase: str | None = None
    steps_per_s: float | None = Field(None, description="Over the last 10 minutes, by the sidecar's clock.")
    mean_steps_per_s: float | None = Field(
        None, description="Over the whole attempt, by the sidecar's clock: what indexes are compared by."
    )
    slow_index: str | None = Field(
        None,
        description="In a multi-pod soak: this index ran below the other indexes' median rate, as the "
        "run's ledger showed them when it ended (sidecar.core.slow_index).",
    )
    eta_s: float | None = Field(None, description="Seconds until total_steps at that rate.")
    finish_note: str | None = Field(
        None, description="Said once when, at that rate, the run would pass the deadline's soft stop."
    )
    records_refused: int = Field(
        0,
        description="progress.jsonl lines refused: those newer than the newest valid record, and any "
        "beyond the 1,024 parsed per read.",
    )
    step_time_trend: LeakTrend | None = Field(
        None,
        description="Seconds per step, its Theil-Sen trend per hour with the 95 % interval: a low end "
        "above zero is a slowdown the samples show beyond doubt.",
    )
    drop_per_hour_pct: float | None = Field(
        None, description="How much lower the throughput is an hour on at the trend's low end, percent."
    )
    drop_since_first_hour_pct: float | None = Field(
        None, description="The last 10 minutes' throughput against the first hour's: percent lower."
    )
    slowdown: str | None = Field(None, description="A slowdown the step times show beyond doubt, in words.")
    phase_calibration_factor: float | None = Field(
        None, description="monitor.phase_calibration_factor: null, the phases' timeouts as configured."
    )
    phase_timeouts: list[PhaseTimeout] = Field(
        default_factory=list, description="Each phase but train's stale timeout, as this attempt found it."
    )
