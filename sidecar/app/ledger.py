"""The attempt added to its run's ledger once its artifact is delivered (and the earlier attempts
that ended without a verdict, as the attempt found them): the run's budget so far is what the
publication and the metrics then tell.

A ledger that cannot be written is told on stderr and changes no verdict: every attempt's
artifact holds its own phases, and the next attempt adds what is missing.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.app.ports import Ports
from sidecar.app.values import RunRequest, Started
from sidecar.core.artifact import Artifact
from sidecar.core.artifact.lost import describe_lost, lost_attempts
from sidecar.core.artifact.models import LostAttempt
from sidecar.core.artifact.progress import ProgressInfo
from sidecar.core.errors import ConfigError, SoakError
from sidecar.core.ledger.budget import RunBudget
from sidecar.core.ledger.phases import PHASES, Phase
from sidecar.core.ledger.record import LOST, Ledger, LedgerEntry, check_entry, ledger_rate, with_entry
from sidecar.core.publication import sanitize
from sidecar.core.slow_index import IndexRate, slow_indexes


@dataclass(frozen=True)
class LedgerNote:
    """The run's budget as the ledger written says, and where it is."""

    budget: RunBudget
    location: str


def attempt_entry(artifact: Artifact, *, artifact_uri: str | None, end: float) -> LedgerEntry | None:
    """The attempt as the ledger lists it; None for a run that got no attempt number."""
    attempt, index = artifact.context.get("attempt"), artifact.context.get("index")
    if not isinstance(attempt, int) or attempt < 1:
        return None
    info = artifact.phases
    phases = tuple(
        Phase(p.kind, p.start_unix, p.start_unix + p.seconds)
        for p in (info.phases if info else ())
        if p.kind in PHASES
    )
    start = phases[0].start if phases else end
    progress, node = artifact.resource_summary.progress, artifact.context.get("node")
    return LedgerEntry(
        attempt=attempt,
        index=index if isinstance(index, int) else None,
        status=artifact.status,
        classification=artifact.failure_classification,
        start=start,
        end=max(start, phases[-1].end if phases else end),
        phases=phases,
        lost_work_known=info.lost_work_known if info else True,
        artifact=artifact_uri,
        steps_per_s=ledger_rate(progress.mean_steps_per_s if progress else None),
        node=node if isinstance(node, str) and node else None,
    )


def lost_entry(lost: LostAttempt, index: int | None) -> LedgerEntry | None:
    """An earlier attempt that ended without a verdict: from its start to its last evidence, no
    phase guessed; None when its record says neither."""
    start, end = lost.started_unix, lost.last_evidence_unix
    if start is None or end is None:
        return None
    entry = LedgerEntry(
        attempt=lost.attempt,
        index=index,
        status=LOST,
        classification=None,
        start=min(start, end),
        end=end,
        phases=(),
        artifact=lost.evidence,
    )
    try:  # its record is anyone's claim: a time the ledger's readers refuse leaves it out
        check_entry(entry)
    except ConfigError:
        return None
    return entry


def record_attempt(
    ports: Ports,
    entries: Sequence[LedgerEntry],
    *,
    run_id: str,
    runs_prefix: str,
    deadline_started_unix: float | None,
) -> LedgerNote | None:
    """``entries`` added to every ledger of the run (the bucket's first); the first one written."""
    note: LedgerNote | None = None

    if not entries:
        return None
    first, *rest = entries

    def change(ledger: Ledger | None) -> Ledger:
        updated = with_entry(ledger, first, run_id=run_id, deadline_started_unix=deadline_started_unix)
        for entry in rest:
            updated = with_entry(updated, entry, run_id=run_id, deadline_started_unix=deadline_started_unix)
        return updated

    for store in ports.ledgers:
        try:
            written = store.update(run_id, runs_prefix, change)
        except SoakError as exc:
            print(f"soak-sidecar: ledger: {sanitize(str(exc), 1024)}", file=sys.stderr)
            continue
        if note is None:
            note = LedgerNote(written.budget(), store.location(run_id, runs_prefix))
    return note


def earlier_budget(ports: Ports, *, run_id: str, runs_prefix: str, until: float) -> RunBudget | None:
    """The run's budget up to ``until`` as the first readable ledger says (before this attempt)."""
    for store in ports.ledgers:
        try:
            found = store.read(run_id, runs_prefix)
        except SoakError as exc:
            print(f"soak-sidecar: ledger: {sanitize(str(exc), 1024)}", file=sys.stderr)
            continue
        if found is not None:
            return found.budget(until)
    return None


def slow_beside_other_indexes(
    ports: Ports, started: Started, runs_prefix: str, own: ProgressInfo
) -> str | None:
    """A multi-pod soak's index whose mean rate is well below the other indexes', as the run's
    ledger lists them when it ends (sidecar.core.slow_index): what its artifact says. A slow index
    with the same total as the others ends last, so it sees them all. Looking never stops the run."""
    request = started.request
    if request.index is None or own.mean_steps_per_s is None:
        return None
    for store in ports.ledgers:
        try:
            found = store.read(request.run_id, runs_prefix)
        except SoakError as exc:
            print(f"soak-sidecar: ledger: {sanitize(str(exc), 1024)}", file=sys.stderr)
            continue
        if found is None:
            continue
        node = request.context.get("node")
        rates = [
            IndexRate(e.index, e.attempt, e.steps_per_s, e.node)
            for e in found.entries
            if e.index is not None and e.index != request.index and e.steps_per_s is not None
        ]
        rates.append(IndexRate(request.index, started.attempt or 1, own.mean_steps_per_s, node))
        slow = [each for each in slow_indexes(rates) if each.index == request.index]
        return slow[0].describe() if slow else None
    return None


def earlier_lost(ports: Ports, request: RunRequest, attempt: int, *, prefix: str) -> tuple[LostAttempt, ...]:
    """Earlier attempts of this slot (under the run's ``prefix``) that ended without a verdict: told
    now, kept in the artifact. Looking never stops the run."""
    if attempt == 1:
        return ()  # none before it: no listing of the run's prefix (every index of a soak starts here)
    lost: dict[int, LostAttempt] = {}
    for history in ports.histories:
        try:
            found = history.find(request.run_id, prefix)
            for each in lost_attempts(found, run_id=request.run_id, index=request.index, before=attempt):
                lost.setdefault(each.attempt, each)
        except Exception as exc:  # others can write what is read here: a record nothing foresaw
            why = sanitize(f"{type(exc).__name__}: {exc}", 1024)
            print(f"soak-sidecar: earlier attempts not all checked: {why}", file=sys.stderr)
    ordered = tuple(lost[number] for number in sorted(lost))
    for each in ordered:
        print(f"soak-sidecar: {describe_lost(each)}", file=sys.stderr)
    return ordered
