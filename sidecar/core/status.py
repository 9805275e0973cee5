"""The live status: one line on a terminal, one JSON object per sample in logs."""

from __future__ import annotations

import json

from sidecar.core.samples import Sample


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def status_fields(
    sample: Sample, *, budget_left_s: float | None, progress_age_s: float | None, eta_s: float | None = None
) -> dict[str, object]:
    proc = sample.process
    progress = sample.progress
    gpu = sample.gpu.used_memory_mib_total
    return {
        "event": "sample",
        "elapsed_s": round(sample.elapsed_s, 3),
        "budget_left_s": None if budget_left_s is None else round(budget_left_s, 1),
        "processes": proc.process_count,
        "zombies": proc.zombie_count,
        "rss_mib": round(proc.rss_kib_total / 1024, 1),
        "fds": proc.fd_count_total,
        "gpu_used_mib": None if gpu is None else round(gpu, 1),
        "gpu_attribution": sample.gpu.attribution,
        "progress_age_s": None if progress_age_s is None else round(progress_age_s, 1),
        "step": progress.step,
        "total_steps": progress.total_steps,
        "phase": progress.phase,
        "eta_s": None if eta_s is None else round(eta_s, 1),
    }


def status_line(
    sample: Sample,
    *,
    budget_left_s: float | None,
    progress_age_s: float | None,
    eta_s: float | None = None,
    width: int = 200,
) -> str:
    """One line of at most ``width - 1`` characters (a full line would wrap and repeat on every
    redraw); the least important fields go first when it does not fit."""
    proc = sample.process
    gpu = sample.gpu.used_memory_mib_total
    progress = (
        "no progress yet" if progress_age_s is None else f"last progress {_duration(progress_age_s)} ago"
    )
    fields = [
        f"elapsed {_duration(sample.elapsed_s)}",
        f"budget left {_duration(budget_left_s)}",
        *_steps(sample, eta_s),
        progress,
        f"rss {proc.rss_kib_total / 1024:.0f} MiB",
        f"procs {proc.process_count}",
        f"fds {proc.fd_count_total}",
        f"gpu {'-' if gpu is None else f'{gpu:.0f} MiB'}",
    ]
    room = max(width - 1, 1)
    while len(fields) > 1 and len("  ".join(fields)) > room:
        fields.pop()
    return "  ".join(fields)[:room]


def _steps(sample: Sample, eta_s: float | None) -> list[str]:
    """Where the trainer's progress records put it: its step (of its declared total), its phase when
    not training, and the estimated finish."""
    progress = sample.progress
    if progress.step is None:
        return []
    of = "" if progress.total_steps is None else f"/{progress.total_steps}"
    phase = "" if progress.phase in (None, "train") else f" ({progress.phase})"
    shown = [f"step {progress.step}{of}{phase}"]
    return shown if eta_s is None else [*shown, f"eta {_duration(eta_s)}"]


def status_json(
    sample: Sample, *, budget_left_s: float | None, progress_age_s: float | None, eta_s: float | None = None
) -> str:
    return json.dumps(
        status_fields(sample, budget_left_s=budget_left_s, progress_age_s=progress_age_s, eta_s=eta_s)
    )
