"""What a running sidecar tells Kubernetes about its attempt (pure): the phase and a heartbeat, the
trainer's rate and estimated finish, and where the attempt's evidence is. Advisory annotations,
refreshed now and then; the verdict's are in sidecar.core.publication."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.core.publication import (
    DEFAULT_PREFIX,
    PROGRESS_KEY_BUDGETS,
    URI_BYTES,
    annotation_key,
    int_or_none,
    normalize_prefix,
    rate_or_none,
    rate_text,
    sanitize,
    unix_text,
)

# A finish further off than a year (a trainer barely moving) is no estimate worth annotating.
ETA_HORIZON_S = 366 * 86_400.0


@dataclass(frozen=True)
class ProgressFigures:
    """Where the trainer's progress records put it, by the sidecar's clock: the recent steps per
    second, and the wall time its declared total is reached at that rate."""

    steps_per_s: float | None = None
    eta_unix: float | None = None


def build_progress_annotations(
    phase: str, heartbeat_unix: float, prefix: str = DEFAULT_PREFIX, figures: ProgressFigures | None = None
) -> dict[str, str | None]:
    """Annotations a running sidecar refreshes now and then: its phase and a heartbeat time, and
    with ``figures`` (the trainer writes progress records) its rate and estimated finish, each
    deleted while it has none (a merge patch's null), never left stale."""
    beat = str(int(heartbeat_unix)) if math.isfinite(heartbeat_unix) else None
    annotations = {
        annotation_key(prefix, "phase"): sanitize(phase, PROGRESS_KEY_BUDGETS["phase"]),
        annotation_key(prefix, "heartbeat"): beat,
    }
    if figures is not None:
        annotations[annotation_key(prefix, "steps-per-s")] = rate_text(figures.steps_per_s)
        eta = figures.eta_unix
        within = eta is not None and eta - heartbeat_unix <= ETA_HORIZON_S
        annotations[annotation_key(prefix, "eta")] = unix_text(eta) if within else None
    return annotations


def parse_progress_figures(
    annotations: Mapping[str, str] | None, prefix: str = DEFAULT_PREFIX
) -> ProgressFigures | None:
    """A running pod's rate and estimated finish (a claim of the pod about itself); None without."""
    if not annotations:
        return None
    base = normalize_prefix(prefix)
    rate = rate_or_none(annotations.get(f"{base}steps-per-s"))
    eta = int_or_none(annotations.get(f"{base}eta"))
    if rate is None and eta is None:
        return None
    return ProgressFigures(rate, None if eta is None else float(eta))


def build_evidence_annotations(
    uri: str, at_unix: float, prefix: str = DEFAULT_PREFIX
) -> dict[str, str | None]:
    """Annotations that say where a running attempt's evidence is and when it last reached the store."""
    return {
        annotation_key(prefix, "evidence"): sanitize(uri, PROGRESS_KEY_BUDGETS["evidence"]),
        annotation_key(prefix, "evidence-at"): str(int(at_unix)) if math.isfinite(at_unix) else None,
    }


@dataclass(frozen=True)
class EvidenceNote:
    """A running attempt's evidence as its pod's annotations tell it (a claim of the pod about itself)."""

    uri: str
    at_unix: int | None


def parse_evidence(
    annotations: Mapping[str, str] | None, prefix: str = DEFAULT_PREFIX
) -> EvidenceNote | None:
    if not annotations:
        return None
    base = normalize_prefix(prefix)
    uri = annotations.get(f"{base}evidence")
    if not uri:
        return None
    at = annotations.get(f"{base}evidence-at") or ""
    return EvidenceNote(
        sanitize(uri, URI_BYTES), int(at) if at.isascii() and at.isdigit() and len(at) <= 11 else None
    )
