"""Create-or-resume of a run's deadline record: one record per run identity, created exclusively
and durably, resumed thereafter and never extended or re-created; the attempt ledger is the tamper
evidence for a deleted or replaced record."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.boot import BootClock, ReferenceTime
from sidecar.core.deadline.record import DeadlineRecord, encode_record, new_record, parse_record, shorten
from sidecar.core.errors import ConfigError, DeadlineRecordError, RecordExistsError, RefusedError
from sidecar.core.identity import RunIdentity
from sidecar.core.ports import DeadlineStore


def _require_same_identity(record: DeadlineRecord, identity: RunIdentity) -> None:
    differing = record.identity.differences(identity)
    if differing:
        stored, wanted = record.identity.canonical(), identity.canonical()
        details = "; ".join(
            f"{name}: record {shorten(stored[name])}, now {shorten(wanted[name])}" for name in differing
        )
        raise RefusedError(
            f"deadline identity/config mismatch; never extend an existing job "
            f"(run {identity.run_id} differs in {', '.join(differing)}: {details})"
        )


def _load_verified(
    store: DeadlineStore, identity: RunIdentity, *, max_budget_s: float
) -> DeadlineRecord | None:
    data = store.load(identity.run_id)
    if data is None:
        return None
    record = parse_record(data, max_budget_s=max_budget_s)
    _require_same_identity(record, identity)
    return record


# How far a record's start may lie after the ledger's first attempt claim: the claim is made right
# after the record is created, by the same process, unless that attempt died in between and a later
# one on another node (another wall clock) claimed first. NTP keeps nodes within milliseconds.
LEDGER_SKEW_TOLERANCE_S = 60.0


def check_ledger(
    record: DeadlineRecord | None, claims: list[float | None], *, run_id: str, location: str
) -> None:
    """Tamper evidence from the attempt ledger (claims are made only after the record exists):
    attempts without a record mean the record was deleted; a record that starts after the first
    claim was replaced or shifted. Either would grant time the run never had."""
    if record is None and claims:
        raise RefusedError(
            f"the attempt ledger holds {len(claims)} attempt(s) of run {run_id} but its deadline record "
            f"is missing from {location}: it was deleted or moved; refusing a fresh budget"
        )
    known = [claimed for claimed in claims if claimed is not None]
    if record is None or not known:
        return
    first = min(known)
    if record.started_unix > first + LEDGER_SKEW_TOLERANCE_S:
        raise RefusedError(
            f"deadline record of run {run_id} starts at {record.started_unix:.3f}, "
            f"{record.started_unix - first:.1f} s after the first attempt was claimed ({first:.3f}; "
            f"tolerance {LEDGER_SKEW_TOLERANCE_S:g} s): the record was replaced or its window shifted"
        )


@dataclass(frozen=True)
class Obtained:
    record: DeadlineRecord
    # This call created the record: not a resume, nor a concurrent creator's (another index of the
    # same soak that won the exclusive create between our load and our create).
    created: bool


def obtain_record(
    store: DeadlineStore,
    identity: RunIdentity,
    *,
    now_wall: float,
    resume_required: bool,
    max_budget_s: float,
    boot: BootClock | None = None,
    reference: ReferenceTime | None = None,
) -> Obtained:
    """The run's record: the stored one if any (verified, never extended), else a new one.

    ``resume_required`` (an explicit resume) refuses instead of creating a fresh budget.
    Expiry is not judged here: build a ``DeadlineClock`` and call ``check_startable``.
    """
    if identity.budget_s > max_budget_s:
        raise ConfigError(f"budget {identity.budget_s} s exceeds max_budget_s {max_budget_s} s")
    # The ledger first: every claim is made after its record exists, so a claim seen now has its
    # record visible to the load after it. Loading first would let a concurrent creator (another
    # index of the same soak) create and claim in between: a claim without a record, refused as
    # a deleted record.
    claims = store.attempt_claims(identity.run_id)
    existing = _load_verified(store, identity, max_budget_s=max_budget_s)
    check_ledger(existing, claims, run_id=identity.run_id, location=store.location)
    if existing is not None:
        return Obtained(existing, created=False)
    if resume_required:
        raise RefusedError(
            f"explicit resume requires the original deadline record; no fresh budget "
            f"(no record for run {identity.run_id} in {store.location}): a resumed attempt "
            "(--resume, --resume-checkpoint, or --auto-resume finding its checkpoint) takes its "
            "run's --run-id and deadline store"
        )
    payload = encode_record(new_record(identity, now_wall=now_wall, boot=boot, reference=reference))
    # When a concurrent creator wins, its record is the run's record, verified like any other.
    created = True
    try:
        store.create(identity.run_id, payload)
    except RecordExistsError:
        created = False
    # Read back what is durable rather than trusting what we meant to write.
    stored = _load_verified(store, identity, max_budget_s=max_budget_s)
    if stored is None:
        raise DeadlineRecordError(
            f"deadline record for run {identity.run_id} vanished from {store.location} after creation"
        )
    return Obtained(stored, created=created)
