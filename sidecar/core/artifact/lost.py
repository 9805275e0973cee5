"""Earlier attempts that ended without a verdict, from what their evidence locations hold (pure).

An attempt whose sidecar was SIGKILLed, or whose node was lost, leaves its provisional artifact
(status running or stopping) and its segments, but no final artifact. The next attempt finds them
and records them in its own artifact; ``soak-sidecar report`` renders one as a partial attempt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sidecar.core.artifact.models import PROVISIONAL_STATUSES, LostAttempt, claimed_utc
from sidecar.core.publication import sanitize

# A provisional artifact holds no samples: anything larger is not one.
PROVISIONAL_LIMIT_BYTES = 1024 * 1024
# What a lost attempt's line may carry of what its location holds (its reason, where it is):
# others could have written both, so they are made one printable line of bounded size.
REASON_BYTES = 1024
LOCATION_BYTES = 1024


@dataclass(frozen=True)
class FoundAttempt:
    """One attempt's evidence location as an adapter found it."""

    location: str  # where its provisional artifact is (s3:// URI or local path)
    final: bool  # a final artifact is there too: it ended with a verdict
    record: bytes | None  # its latest provisional record (or local artifact.json), bounded
    last_unix: float | None  # its newest object or file


def lost_attempts(
    found: Iterable[FoundAttempt], *, run_id: str, index: int | None, before: int
) -> list[LostAttempt]:
    """The attempts of ``run_id`` (and ``index``) numbered below ``before`` whose evidence holds a
    provisional artifact and no final one, oldest first; one per attempt number. ``found`` is
    consumed one location at a time: a record is dropped once judged."""
    lost: dict[int, LostAttempt] = {}
    for place in found:
        doc = None if place.final else _provisional(place.record)
        if doc is None:
            continue
        context = doc.get("context")
        if not isinstance(context, dict) or context.get("run_id") != run_id or context.get("index") != index:
            continue
        attempt = context.get("attempt")
        if not isinstance(attempt, int) or isinstance(attempt, bool) or not 0 < attempt < before:
            continue
        reason = doc.get("failure_reason")
        lost[attempt] = LostAttempt(
            attempt=attempt,
            status=str(doc["status"]),
            reason=sanitize(reason, REASON_BYTES) if isinstance(reason, str) else None,
            last_evidence_at_utc=claimed_utc(place.last_unix),
            evidence=sanitize(place.location, LOCATION_BYTES),
            started_unix=_unix(doc.get("started_at_utc")),
            last_evidence_unix=place.last_unix,
        )
    return [lost[n] for n in sorted(lost)]


def _unix(stamp: object) -> float | None:
    """An ISO 8601 time with its offset (as ``utc_timestamp`` writes it), None for anything else."""
    if not isinstance(stamp, str) or len(stamp) > 64:
        return None
    try:
        moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None or moment.timestamp() < 0:  # before 1970: no attempt of ours
        return None
    return moment.timestamp()


def _provisional(record: bytes | None) -> dict[str, object] | None:
    if record is None or len(record) > PROVISIONAL_LIMIT_BYTES:
        return None
    try:
        doc = json.loads(record)
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError), nested too deep
        return None
    if not isinstance(doc, dict) or doc.get("status") not in PROVISIONAL_STATUSES:
        return None
    return doc


def describe_lost(attempt: LostAttempt) -> str:
    """One line: "attempt N ended without a verdict (last evidence at T)", and why it was stopping."""
    at, reason = attempt.last_evidence_at_utc, attempt.reason
    when = f" (last evidence at {sanitize(at, 64)})" if at else ""
    why = (
        f"; it was stopping: {sanitize(reason, REASON_BYTES)}"
        if attempt.status == "stopping" and reason
        else ""
    )
    where = sanitize(attempt.evidence, LOCATION_BYTES)
    return f"attempt {attempt.attempt} ended without a verdict{when}{why}: {where}"
