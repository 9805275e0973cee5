"""The verdict delivered: the local artifact first, then the upload, then the publication.

Nothing is lost on the way: an artifact that cannot be written or uploaded changes the verdict
(evidence_lost) and is still published and printed.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from dataclasses import dataclass, field

from sidecar.app.artifact import apply_verdict
from sidecar.app.ledger import LedgerNote, attempt_entry, record_attempt
from sidecar.app.ports import ArtifactFiles, Ports
from sidecar.app.values import RunRequest, RunResult
from sidecar.core import verdict as verdicts
from sidecar.core.artifact import Artifact, UploadInfo, dumps_artifact
from sidecar.core.artifact.objects import ARTIFACT_FILE, SAMPLES_FILE
from sidecar.core.errors import ConfigError, UploadError
from sidecar.core.keys import render_key_prefix
from sidecar.core.ledger.record import LedgerEntry
from sidecar.core.ports import ArtifactSink
from sidecar.core.publication import Publication
from sidecar.settings import Settings


@dataclass(frozen=True)
class LedgerPlace:
    """Where the run's ledger is, and the earlier attempts this one found ended without a verdict."""

    run_id: str
    runs_prefix: str
    deadline_started_unix: float | None
    lost: tuple[LedgerEntry, ...] = ()


@dataclass(frozen=True)
class Delivery:
    """Where the artifact goes beyond the local directory."""

    key_prefix: str
    attempt: int
    deadline_unix: float | None
    index: int | None = None
    indexes: int | None = None
    # Evidence sent while the trainer ran (sidecar.app.evidence), and its first failure: listed in
    # the final artifact's upload record, which starts from this.
    sent: UploadInfo = field(default_factory=UploadInfo)
    ledger: LedgerPlace | None = None


def deliver(
    ports: Ports, files: ArtifactFiles, artifact: Artifact, verdict: verdicts.Verdict, delivery: Delivery
) -> RunResult:
    try:
        artifact_path = files.write(ARTIFACT_FILE, dumps_artifact(artifact).encode())
    except OSError as exc:
        # Disk full, read-only: the verdict must still be told (stderr, publication).
        final = verdicts.with_upload_error(verdict, f"the local artifact was not written: {exc}")
        apply_verdict(artifact, final)
        print(f"soak-sidecar: cannot write {files.path / ARTIFACT_FILE}: {exc}", file=sys.stderr)
        _publish(ports, files, final, artifact, delivery, written=False)
        return RunResult(verdict=final, artifact_path=None, exit_code=int(final.exit_code))
    final = verdict
    if ports.sink is not None:
        final = _upload(ports.sink, ports, files, artifact, verdict=verdict, delivery=delivery)
    note = _add_to_ledger(ports, artifact, delivery, local=str(artifact_path))
    _publish(ports, files, final, artifact, delivery, written=True, ledger=note)
    return RunResult(verdict=final, artifact_path=artifact_path, exit_code=int(final.exit_code))


def _upload(
    sink: ArtifactSink,
    ports: Ports,
    files: ArtifactFiles,
    artifact: Artifact,
    *,
    verdict: verdicts.Verdict,
    delivery: Delivery,
) -> verdicts.Verdict:
    """The evidence files first, then the artifact naming their URIs; the local copy follows."""
    upload = delivery.sent.model_copy(deep=True)
    final = verdict
    evidence = [*files.existing([SAMPLES_FILE]), *files.keep_copies(ports.channel.console_logs())]
    try:
        for obj in sink.upload(evidence, delivery.key_prefix):
            upload.uris[obj.path.name] = obj.uri
            upload.sha256[obj.path.name] = obj.sha256
        artifact.upload = upload
        artifact_path = files.write(ARTIFACT_FILE, dumps_artifact(artifact).encode())
        for obj in sink.upload([artifact_path], delivery.key_prefix):
            upload.uris[obj.path.name] = obj.uri
            upload.sha256[obj.path.name] = obj.sha256
    except (UploadError, ConfigError) as exc:
        upload.error = str(exc)
        final = verdicts.with_upload_error(verdict, str(exc))
        artifact.upload = upload
        apply_verdict(artifact, final)
    with contextlib.suppress(OSError):  # the first local copy stands if this one fails
        files.write(ARTIFACT_FILE, dumps_artifact(artifact).encode())
    return final


def _add_to_ledger(ports: Ports, artifact: Artifact, delivery: Delivery, *, local: str) -> LedgerNote | None:
    place = delivery.ledger
    uploaded = artifact.upload.uris.get(ARTIFACT_FILE) if artifact.upload else None
    entry = attempt_entry(artifact, artifact_uri=uploaded or local, end=ports.clock.wall())
    if place is None or entry is None:
        return None
    note = record_attempt(
        ports,
        [*place.lost, entry],
        run_id=place.run_id,
        runs_prefix=place.runs_prefix,
        deadline_started_unix=place.deadline_started_unix,
    )
    if note is not None:
        budget = note.budget
        print(
            f"soak-sidecar: goodput {budget.goodput:.1%} since the deadline's start (productive "
            f"{budget.productive_s:.0f} s of {budget.wall_s:.0f} s); ledger {note.location}",
            file=sys.stderr,
        )
    return note


def _publish(
    ports: Ports,
    files: ArtifactFiles,
    final: verdicts.Verdict,
    artifact: Artifact,
    delivery: Delivery,
    *,
    written: bool,
    ledger: LedgerNote | None = None,
) -> None:
    if ports.metrics is not None:  # the budget first: a scrape that shows the verdict shows it too
        if ledger is not None:
            budget = ledger.budget
            ports.metrics.run_budget(budget.goodput, {"productive": budget.productive_s, **budget.badput_s})
        ports.metrics.verdict(final.status, final.classification, int(final.exit_code))
    if ports.publisher is None:
        return
    upload = artifact.upload
    local = str(files.path / ARTIFACT_FILE) if written else None
    problems = ports.publisher.publish(
        Publication(
            status=final.status,
            classification=final.classification,
            reason=final.reason or "",
            exit_code=int(final.exit_code),
            artifact_uri=(upload.uris.get(ARTIFACT_FILE) if upload else None) or local,
            artifact_sha256=(upload.sha256.get(ARTIFACT_FILE) if upload else None)
            or (files.sha256(ARTIFACT_FILE) if written else None),
            attempt=delivery.attempt,
            deadline_unix=delivery.deadline_unix,
            index=delivery.index,
            indexes=delivery.indexes,
            goodput=None if ledger is None else ledger.budget.goodput,
            ledger_uri=None if ledger is None else ledger.location,
            steps_per_s=progress.mean_steps_per_s
            if (progress := artifact.resource_summary.progress)
            else None,
        )
    )
    for problem in problems:
        print(f"soak-sidecar: publication: {problem}", file=sys.stderr)


def key_prefix(settings: Settings, request: RunRequest, attempt: str, *, pod: str | None = None) -> str:
    """The attempt's prefix in the bucket, from s3.key_template. ``attempt``: its number, or for a
    run refused before it had one, its unique local directory name (refusals never share a key)."""
    s3 = settings.s3
    return render_key_prefix(
        s3.key_template,
        {
            "prefix": s3.prefix,
            "namespace": settings.kube.namespace or "local",
            "job": str(request.context.get("job") or "local"),
            "pod": pod or settings.kube.pod_name or "local",
            "run_id": request.run_id,
            "attempt": attempt,
        },
    )


def runs_prefix(settings: Settings, request: RunRequest) -> str:
    """The bucket prefix every attempt of the run shares (where earlier attempts are looked for):
    the key template rendered for two different attempts and pods, cut to their common folder."""
    first = key_prefix(settings, request, "1", pod="a").split("/")
    second = key_prefix(settings, request, "2", pod="b").split("/")
    shared = itertools.takewhile(lambda pair: pair[0] == pair[1], zip(first, second, strict=False))
    return "".join(f"{a}/" for a, _ in shared)
