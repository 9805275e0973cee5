"""The persistent total-job deadline: record format, create-or-resume, and the clock.

Pure: the store is injected (``sidecar.core.ports.DeadlineStore``) and every time is an argument.
Rules kept from the training-deadline seed:

- one record per run identity, created exclusively and durably, resumed thereafter and never
  extended or re-created (a changed identity, budget or margin is refused);
- a corrupt, inconsistent or tampered record fails closed;
- an explicit resume never creates a fresh budget;
- remaining time is the minimum of wall-clock and monotonic remaining, so rolling the wall
  clock back cannot extend a running attempt;
- across attempts on the same boot, CLOCK_BOOTTIME anchored in the record bounds the elapsed
  time too: a wall clock set back between attempts is refused with the figures, never believed;
- nothing starts with the checkpoint margin or less left.

The caller holds ``store.lock(run_id)`` around ``create_or_resume`` and for the rest of its life.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from sidecar.core.boot import BootClock, ReferenceTime, StoreClock
from sidecar.core.errors import (
    ConfigError,
    DeadlineExpiredError,
    DeadlineRecordError,
    InsufficientBudgetError,
    RecordExistsError,
    RefusedError,
)
from sidecar.core.identity import RunIdentity, describe_validation_error
from sidecar.core.ports import DeadlineStore

RECORD_FORMAT = "soak-sidecar-deadline-v3"
# Older records are still resumed: v2 (no reference time) bounded by the wall clock, CLOCK_BOOTTIME
# and the store's clock; v1 (no boot anchor either) by the wall clock and the store's clock.
V2_RECORD_FORMAT = "soak-sidecar-deadline-v2"
LEGACY_RECORD_FORMAT = "soak-sidecar-deadline-v1"
# How far the wall clock may claim more time left than CLOCK_BOOTTIME on the same boot: both count
# real time (suspend included), so under NTP they agree to well under a second.
CLOCK_SKEW_TOLERANCE_S = 60.0
# Far above any real record; bounds what a reader loads from a tampered store.
MAX_RECORD_BYTES = 1024 * 1024
# Attempts of one run are numbered by exclusive creates; a Job never retries anywhere near this.
MAX_ATTEMPTS = 10_000
# Same tolerance as the seed: deadline_unix must equal started_unix + budget_seconds.
CONSISTENCY_TOLERANCE_S = 1e-5

_NUMBER_KEYS = ("started_unix", "deadline_unix", "budget_seconds", "checkpoint_margin_seconds")
_LEGACY_KEYS = frozenset({"format", *_NUMBER_KEYS, "identity", "identity_sha256"})
_V2_RECORD_KEYS = _LEGACY_KEYS | {"boot"}
_RECORD_KEYS = _V2_RECORD_KEYS | {"reference"}


@dataclass(frozen=True)
class DeadlineRecord:
    """One run's deadline as stored. Build it with ``new_record`` or ``parse_record`` only."""

    started_unix: float
    deadline_unix: float
    budget_seconds: float
    checkpoint_margin_seconds: float
    identity: RunIdentity
    identity_sha256: str
    # CLOCK_BOOTTIME when the record was made, and on which boot; None for v1 records.
    boot: BootClock | None = None
    # A clock outside the node (the apiserver's) when the record was made; None where none was read.
    reference: ReferenceTime | None = None

    @property
    def soft_stop_unix(self) -> float:
        return self.deadline_unix - self.checkpoint_margin_seconds

    def as_json(self) -> dict[str, Any]:
        return {
            "format": RECORD_FORMAT,
            "started_unix": self.started_unix,
            "deadline_unix": self.deadline_unix,
            "budget_seconds": self.budget_seconds,
            "checkpoint_margin_seconds": self.checkpoint_margin_seconds,
            "identity": self.identity.canonical(),
            "identity_sha256": self.identity_sha256,
            "boot": None
            if self.boot is None
            else {"id": self.boot.boot_id, "boottime_s": self.boot.boottime_s},
            "reference": None
            if self.reference is None
            else {"source": self.reference.source, "unix": self.reference.unix},
        }


def new_record(
    identity: RunIdentity,
    *,
    now_wall: float,
    boot: BootClock | None = None,
    reference: ReferenceTime | None = None,
) -> DeadlineRecord:
    """A fresh record whose budget starts at ``now_wall`` (and at ``boot``'s boottime, and at
    ``reference``'s time)."""
    if not math.isfinite(now_wall):
        raise ConfigError("wall clock is not a finite number")
    return DeadlineRecord(
        started_unix=now_wall,
        deadline_unix=now_wall + identity.budget_s,
        budget_seconds=identity.budget_s,
        checkpoint_margin_seconds=identity.checkpoint_margin_s,
        identity=identity,
        identity_sha256=identity.digest(),
        boot=boot,
        reference=reference,
    )


def encode_record(record: DeadlineRecord) -> bytes:
    """Stable, human-readable bytes (sorted keys; floats round-trip exactly through JSON)."""
    return (json.dumps(record.as_json(), sort_keys=True, indent=2, allow_nan=False) + "\n").encode()


def _reject_constant(token: str) -> float:
    raise ValueError(f"non-finite number {token}")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def parse_record(data: bytes, *, max_budget_s: float) -> DeadlineRecord:
    """Validate stored bytes; anything doubtful raises DeadlineRecordError (fail closed)."""
    value = _record_object(data)
    started, deadline, budget, margin = _record_numbers(value, max_budget_s=max_budget_s)
    return DeadlineRecord(
        started_unix=started,
        deadline_unix=deadline,
        budget_seconds=budget,
        checkpoint_margin_seconds=margin,
        identity=_record_identity(value, budget=budget, margin=margin),
        identity_sha256=value["identity_sha256"],
        boot=_record_boot(value.get("boot")),
        reference=_record_reference(value.get("reference")),
    )


def _record_boot(value: object) -> BootClock | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"id", "boottime_s"}:
        raise DeadlineRecordError("deadline record boot must be null or {id, boottime_s}")
    boot_id, boottime = value["id"], value["boottime_s"]
    if not isinstance(boot_id, str) or not boot_id:
        raise DeadlineRecordError(f"invalid deadline record boot id {boot_id!r}")
    if isinstance(boottime, bool) or not isinstance(boottime, (int, float)) or not math.isfinite(boottime):
        raise DeadlineRecordError(f"invalid deadline record boottime_s {boottime!r}")
    if boottime < 0:
        raise DeadlineRecordError(f"invalid deadline record boottime_s {boottime!r}")
    return BootClock(boot_id=boot_id, boottime_s=float(boottime))


def _record_reference(value: object) -> ReferenceTime | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"source", "unix"}:
        raise DeadlineRecordError("deadline record reference must be null or {source, unix}")
    source, unix = value["source"], value["unix"]
    if not isinstance(source, str) or not source or len(source) > 200:
        raise DeadlineRecordError(f"invalid deadline record reference source {_short(source)}")
    if isinstance(unix, bool) or not isinstance(unix, (int, float)) or not math.isfinite(unix) or unix < 0:
        raise DeadlineRecordError(f"invalid deadline record reference time {unix!r}")
    return ReferenceTime(source=source, unix=float(unix))


def _record_object(data: bytes) -> dict[str, Any]:
    """The record's JSON object, in this format and with exactly the record's keys."""
    if len(data) > MAX_RECORD_BYTES:
        raise DeadlineRecordError(f"deadline record is larger than {MAX_RECORD_BYTES} bytes")
    try:
        value = json.loads(
            data.decode("utf-8"), parse_constant=_reject_constant, object_pairs_hook=_no_duplicates
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise DeadlineRecordError(f"deadline record is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise DeadlineRecordError("deadline record is not a JSON object")
    keys = {
        RECORD_FORMAT: _RECORD_KEYS,
        V2_RECORD_FORMAT: _V2_RECORD_KEYS,
        LEGACY_RECORD_FORMAT: _LEGACY_KEYS,
    }.get(str(value.get("format")))
    if keys is None:
        raise DeadlineRecordError(
            f"deadline record format is {value.get('format')!r}, expected {RECORD_FORMAT!r}"
        )
    missing = sorted(keys - value.keys())
    unknown = sorted(value.keys() - keys)
    if missing or unknown:
        raise DeadlineRecordError(f"deadline record keys: missing {missing}, unknown {unknown}")
    return value


def _record_numbers(value: dict[str, Any], *, max_budget_s: float) -> tuple[float, float, float, float]:
    """Started, deadline, budget and margin: finite, in range and consistent with each other."""
    for key in _NUMBER_KEYS:
        number = value[key]
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
            raise DeadlineRecordError(f"invalid deadline number {key}={number!r}")
    started = float(value["started_unix"])
    deadline = float(value["deadline_unix"])
    budget = float(value["budget_seconds"])
    margin = float(value["checkpoint_margin_seconds"])
    if not 0 < budget <= max_budget_s:
        raise DeadlineRecordError(f"budget_seconds={budget} is not in (0, {max_budget_s}]")
    if not 0 < margin < budget:
        raise DeadlineRecordError(f"invalid checkpoint margin {margin} for budget {budget}")
    if abs(deadline - started - budget) > CONSISTENCY_TOLERANCE_S:
        raise DeadlineRecordError(
            f"inconsistent deadline: deadline_unix - started_unix = {deadline - started}, "
            f"budget_seconds = {budget}"
        )
    return started, deadline, budget, margin


def _record_identity(value: dict[str, Any], *, budget: float, margin: float) -> RunIdentity:
    """The stored identity, matching its digest and the record's budget and margin."""
    try:
        identity = RunIdentity.model_validate(value["identity"])
    except ValidationError as exc:
        raise DeadlineRecordError(
            f"deadline record identity is invalid: {describe_validation_error(exc)}"
        ) from exc
    if value["identity_sha256"] != identity.digest():
        raise DeadlineRecordError("deadline record identity does not match identity_sha256 (tampered)")
    if identity.budget_s != budget or identity.checkpoint_margin_s != margin:
        raise DeadlineRecordError("deadline record budget/margin disagree with its identity (tampered)")
    return identity


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _require_same_identity(record: DeadlineRecord, identity: RunIdentity) -> None:
    differing = record.identity.differences(identity)
    if differing:
        stored, wanted = record.identity.canonical(), identity.canonical()
        details = "; ".join(
            f"{name}: record {_short(stored[name])}, now {_short(wanted[name])}" for name in differing
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


def create_or_resume(
    store: DeadlineStore,
    identity: RunIdentity,
    *,
    now_wall: float,
    resume_required: bool,
    max_budget_s: float,
    boot: BootClock | None = None,
    reference: ReferenceTime | None = None,
) -> DeadlineRecord:
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
        return existing
    if resume_required:
        raise RefusedError(
            f"explicit resume requires the original deadline record; no fresh budget "
            f"(no record for run {identity.run_id} in {store.location})"
        )
    payload = encode_record(new_record(identity, now_wall=now_wall, boot=boot, reference=reference))
    # When a concurrent creator wins, its record is the run's record, verified like any other.
    with contextlib.suppress(RecordExistsError):
        store.create(identity.run_id, payload)
    # Read back what is durable rather than trusting what we meant to write.
    stored = _load_verified(store, identity, max_budget_s=max_budget_s)
    if stored is None:
        raise DeadlineRecordError(
            f"deadline record for run {identity.run_id} vanished from {store.location} after creation"
        )
    return stored


class DeadlineClock:
    """Remaining time of one attempt, bounded by every clock that applies.

    At construction, the least of: the wall clock's remaining time; on the record's own boot, the
    budget less the CLOCK_BOOTTIME elapsed since the record was made; where the record holds a
    reference time (the apiserver's) and the same clock is read now, the budget less the reference
    time elapsed since; and where the store tells its own time, the budget less the store-clock time
    elapsed since it wrote the record. A wall
    clock that claims more than another clock by over CLOCK_SKEW_TOLERANCE_S was set back (or is
    behind the store's): refused with the figures. A wall clock ahead only shortens the run. From
    then on the attempt runs on its monotonic clock: a later wall-clock step back raises only the
    wall estimate, which the minimum ignores. ``wall_end`` is the attempt's deadline in this node's
    wall clock (go.json's).
    """

    def __init__(
        self,
        record: DeadlineRecord,
        *,
        now_wall: float,
        now_monotonic: float,
        boot: BootClock | None = None,
        reference: ReferenceTime | None = None,
        store: StoreClock | None = None,
    ) -> None:
        self.record = record
        remaining = record.deadline_unix - now_wall
        anchor = record.boot
        if anchor is not None and boot is not None and boot.boot_id == anchor.boot_id:
            by_boot = record.budget_seconds - (boot.boottime_s - anchor.boottime_s)
            remaining = _least(record, remaining, by_boot, "CLOCK_BOOTTIME on the same boot")
        outside = _reference_clock(record, reference)
        for clock in (outside, store):
            if clock is not None:
                _require_written_when_started(record, clock)
                by_clock = record.budget_seconds - (clock.now - clock.record_written)
                remaining = _least(record, remaining, by_clock, clock.source)
        self.wall_end = now_wall + remaining
        self.monotonic_end = now_monotonic + max(0.0, remaining)

    @property
    def checkpoint_margin_s(self) -> float:
        return self.record.checkpoint_margin_seconds

    def remaining(self, now_wall: float, now_monotonic: float) -> float:
        return min(self.wall_end - now_wall, self.monotonic_end - now_monotonic)

    def expired(self, now_wall: float, now_monotonic: float) -> bool:
        return self.remaining(now_wall, now_monotonic) <= 0


def _reference_clock(record: DeadlineRecord, now: ReferenceTime | None) -> StoreClock | None:
    """The reference clock's reading when the record was made and now, if both come from one clock."""
    made = record.reference
    if made is None or now is None or made.source != now.source:
        return None
    return StoreClock(record_written=made.unix, now=now.unix, source=made.source)


def _least(record: DeadlineRecord, by_wall: float, other: float, source: str) -> float:
    """The smaller remaining time; a wall clock claiming more than ``source`` beyond the tolerance
    is refused with both figures, never believed."""
    if by_wall - other > CLOCK_SKEW_TOLERANCE_S:
        raise RefusedError(
            f"the wall clock claims {by_wall:.1f} s left for run {record.identity.run_id} but {source} "
            f"says {other:.1f} s ({by_wall - other:.1f} s apart, tolerance {CLOCK_SKEW_TOLERANCE_S:g} s): "
            "the wall clock was set back or is behind; refusing rather than grant the difference"
        )
    return min(by_wall, other)


def _require_written_when_started(record: DeadlineRecord, store: StoreClock) -> None:
    """A record that says it started later than the store wrote it grants time it never had (a
    record made by a node whose clock was ahead, or rewritten with a shifted window)."""
    late = record.started_unix - store.record_written
    if late > CLOCK_SKEW_TOLERANCE_S:
        raise RefusedError(
            f"deadline record of run {record.identity.run_id} says it started at {record.started_unix:.1f}, "
            f"{late:.1f} s later than {store.source} dates its making ({store.record_written:.1f}; tolerance "
            f"{CLOCK_SKEW_TOLERANCE_S:g} s): refusing the time it would grant"
        )


def check_startable(clock: DeadlineClock, now_wall: float, now_monotonic: float) -> None:
    """Refuse to start or resume when no more than the checkpoint margin is left."""
    remaining = clock.remaining(now_wall, now_monotonic)
    run_id = clock.record.identity.run_id
    if remaining <= 0:
        raise DeadlineExpiredError(
            f"original job deadline expired {-remaining:.1f} s ago (run {run_id}); no fresh budget"
        )
    if remaining <= clock.checkpoint_margin_s:
        raise InsufficientBudgetError(
            f"insufficient original budget to start/resume: {remaining:.1f} s left, "
            f"checkpoint margin {clock.checkpoint_margin_s:g} s (run {run_id})"
        )
