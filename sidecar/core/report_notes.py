"""What an attempt's page says above its plots about the evidence itself (pure): a provisional
artifact's marker, evidence that does not match its artifact, uploads the store never confirmed."""

from __future__ import annotations

import html
from collections.abc import Sequence

from sidecar.core.artifact.models import claimed_utc
from sidecar.core.report_input import ReportArtifact


def partial_note(artifact: ReportArtifact) -> list[str]:
    """A provisional artifact's marker: no verdict, and how far the evidence goes."""
    if not artifact.partial:
        return []
    last = artifact.last_evidence_unix
    shown = claimed_utc(last)
    when = "" if shown is None else f" (last evidence at {shown})"
    return [
        f'<p class="partial">PARTIAL: no verdict{html.escape(when)}. The attempt is still running, or it '
        "ended without one (its sidecar killed, its node lost): what follows is its evidence up to its "
        "last flush.</p>"
    ]


def integrity_notes(artifact: ReportArtifact, mismatched: Sequence[str]) -> list[str]:
    """Evidence that does not match its artifact, and uploads the store never confirmed."""
    shown = [f'<p class="failed">EVIDENCE NOT MATCHING: {html.escape(line)}</p>' for line in mismatched]
    if artifact.checksums_unverified:
        shown.append(
            "<p>uploads unverified: the store did not confirm their SHA-256 "
            "(s3.accept_unverified_checksums)</p>"
        )
    return shown
