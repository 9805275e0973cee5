"""The deadline record: its stored format, how a fresh one is made, and how stored bytes are
verified. Anything doubtful fails closed (``DeadlineRecordError``)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from sidecar.core.boot import BootClock, ReferenceTime
from sidecar.core.errors import ConfigError, DeadlineRecordError
from sidecar.core.identity import RunIdentity, describe_validation_error
from sidecar.core.json_keys import refuse_duplicate_keys

RECORD_FORMAT = "soak-sidecar-deadline-v3"
# Older records are still resumed: v2 (no reference time) bounded by the wall clock, CLOCK_BOOTTIME
# and the store's clock; v1 (no boot anchor either) by the wall clock and the store's clock.
V2_RECORD_FORMAT = "soak-sidecar-deadline-v2"
LEGACY_RECORD_FORMAT = "soak-sidecar-deadline-v1"
# Far above any real record; bounds what a reader loads from a tampered store.
MAX_RECORD_BYTES = 1024 * 1024
# Attempts of one run are numbered by exclusive creates; a Job never retries anywhere near this.
MAX_ATTEMPTS = 10_000
# deadline_unix must equal started_unix + budget_seconds, up to float rounding of the sum.
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
        raise DeadlineRecordError(f"invalid deadline record reference source {shorten(source)}")
    if isinstance(unix, bool) or not isinstance(unix, (int, float)) or not math.isfinite(unix) or unix < 0:
        raise DeadlineRecordError(f"invalid deadline record reference time {unix!r}")
    return ReferenceTime(source=source, unix=float(unix))


def _record_object(data: bytes) -> dict[str, Any]:
    """The record's JSON object, in this format and with exactly the record's keys."""
    if len(data) > MAX_RECORD_BYTES:
        raise DeadlineRecordError(f"deadline record is larger than {MAX_RECORD_BYTES} bytes")
    try:
        value = json.loads(
            data.decode("utf-8"), parse_constant=_reject_constant, object_pairs_hook=refuse_duplicate_keys
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


def shorten(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
