"""The run's ledger (pure): one JSON document per run, beside its attempts, that every attempt
adds itself to when it ends. It lists each attempt of each index with its phases and the cause
that ended it, and the budget they add up to (``sidecar.core.ledger.budget``).

It outlives pods, Events and Jobs. Anyone who can write the bucket can write it, so a reader
takes it as a claim: one validating parser, bounded in size and entries. A writer merges its own
entry into what it read and writes back only if nothing changed since (the adapter's conditional
write): an entry is never dropped, and a ledger that cannot be read is never overwritten.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from sidecar.core.errors import ConfigError
from sidecar.core.json_keys import refuse_duplicate_keys
from sidecar.core.ledger.budget import AttemptEntry, RunBudget, run_budget
from sidecar.core.ledger.phases import PHASES, AttemptPhases, Phase, PhaseKind
from sidecar.core.report_fields import (
    as_list,
    as_object,
    integer,
    number,
    optional_number,
    optional_text,
    text,
)

LEDGER_FILE = "ledger.json"
# Beside it in the bucket: the pieces each attempt adds before they are folded into it.
LEDGER_PIECES = "ledger.d"
LEDGER_SCHEMA = "soak-sidecar/ledger/1"
LEDGER_LIMIT_BYTES = 16 * 1024 * 1024
LEDGER_ENTRIES_LIMIT = 20_000
TEXT_LIMIT = 1024
PHASES_LIMIT = 64  # an attempt has at most eight kinds of phase
# A lost attempt's status: it ended without a verdict (sidecar killed, node lost).
LOST = "lost"
LOST_CAUSE = "ended without a verdict"


@dataclass(frozen=True)
class LedgerEntry:
    attempt: int
    index: int | None
    status: str  # passed, failed, ..., or "lost"
    classification: str | None
    start: float
    end: float
    phases: tuple[Phase, ...]
    lost_work_known: bool = True
    artifact: str | None = None  # where its artifact is (s3:// URI or local path)
    # The trainer's mean steps per second over the attempt and the node it ran on: what the slow
    # index of a multi-pod soak is named by (sidecar.core.slow_index).
    steps_per_s: float | None = None
    node: str | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (-1 if self.index is None else self.index, self.attempt)

    @property
    def cause(self) -> str | None:
        if self.status == "passed":
            return None
        return LOST_CAUSE if self.status == LOST else (self.classification or self.status)

    def as_attempt(self) -> AttemptEntry:
        return AttemptEntry(
            attempt=self.attempt,
            index=self.index,
            start=self.start,
            end=self.end,
            phases=AttemptPhases(self.phases, self.lost_work_known),
            cause=self.cause,
        )


@dataclass(frozen=True)
class Ledger:
    run_id: str
    deadline_started_unix: float | None
    entries: tuple[LedgerEntry, ...]
    revision: int = 0

    def budget(self, until: float | None = None) -> RunBudget:
        """Where the budget went from the deadline's start to ``until`` (default: the last entry's end)."""
        start = self.deadline_started_unix
        if start is None:
            start = min((e.start for e in self.entries), default=0.0)
        end = until if until is not None else max((e.end for e in self.entries), default=start)
        return run_budget([e.as_attempt() for e in self.entries], deadline_start=start, until=end)


def with_entry(
    ledger: Ledger | None, entry: LedgerEntry, *, run_id: str, deadline_started_unix: float | None
) -> Ledger:
    """``ledger`` (None: a new one) with ``entry`` added; an entry of the same index and attempt is
    replaced, except that a lost attempt never replaces one that ended with a verdict."""
    check_entry(entry)  # never written unless its readers would take it
    base = ledger or Ledger(run_id, deadline_started_unix, ())
    if base.run_id != run_id:
        raise ConfigError(f"the ledger is run {base.run_id!r}'s, not {run_id!r}'s")
    kept = [e for e in base.entries if e.key != entry.key]
    if len(kept) < len(base.entries) and entry.status == LOST:
        return base  # its verdict is already there
    if len(kept) >= LEDGER_ENTRIES_LIMIT:
        raise ConfigError(f"the ledger already lists {LEDGER_ENTRIES_LIMIT} attempts")
    started = base.deadline_started_unix if base.deadline_started_unix is not None else deadline_started_unix
    entries = tuple(sorted([*kept, entry], key=lambda e: e.key))
    return replace(base, deadline_started_unix=started, entries=entries, revision=base.revision + 1)


def ledger_rate(per_s: float | None) -> float | None:
    """A rate as the ledger keeps it: finite and above zero, to six significant digits (a slow rate
    never rounds to zero, which :func:`parse_ledger` refuses with the whole entry); else None."""
    if per_s is None or not math.isfinite(per_s) or per_s <= 0:
        return None
    shown = float(f"{per_s:.6g}")
    return shown if math.isfinite(shown) and shown > 0 else None


def check_entry(entry: LedgerEntry) -> None:
    """ConfigError unless :func:`parse_ledger` would read ``entry`` back."""
    _entry(_entry_doc(entry), f"attempt {entry.attempt}")


def dumps_ledger(ledger: Ledger, *, now: float) -> bytes:
    """The document; its budget (to the last entry's end) is written for readers such as jq, and
    recomputed by :func:`parse_ledger`'s users rather than read back."""
    budget = ledger.budget()
    doc = {
        "schema": LEDGER_SCHEMA,
        "run_id": ledger.run_id,
        "deadline_started_unix": ledger.deadline_started_unix,
        "revision": ledger.revision,
        "updated_unix": round(now, 3),
        "budget": {
            "wall_s": round(budget.wall_s, 3),
            "productive_s": round(budget.productive_s, 3),
            "goodput": round(budget.goodput, 6),
            "badput_s": {cause: round(s, 3) for cause, s in sorted(budget.badput_s.items())},
        },
        "attempts": [_entry_doc(e) for e in ledger.entries],
    }
    data = json.dumps(doc, separators=(",", ":")).encode() + b"\n"
    if len(data) > LEDGER_LIMIT_BYTES:  # readers would refuse it: every later attempt's update too
        raise ConfigError(f"the ledger would be larger than {LEDGER_LIMIT_BYTES} bytes")
    return data


def _entry_doc(entry: LedgerEntry) -> dict[str, object]:
    return {
        "attempt": entry.attempt,
        "index": entry.index,
        "status": entry.status,
        "classification": entry.classification,
        "start_unix": round(entry.start, 6),
        "end_unix": round(entry.end, 6),
        "lost_work_known": entry.lost_work_known,
        "artifact": entry.artifact,
        "phases": [[p.kind, round(p.start, 6), round(p.seconds, 6)] for p in entry.phases],
        "steps_per_s": entry.steps_per_s,
        "node": entry.node,
    }


def parse_ledger(data: bytes, where: str) -> Ledger:
    """The ledger, or ConfigError naming what is wrong (one line)."""
    if len(data) > LEDGER_LIMIT_BYTES:
        raise ConfigError(f"{where} is larger than {LEDGER_LIMIT_BYTES} bytes")
    try:
        doc = json.loads(data, object_pairs_hook=refuse_duplicate_keys)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{where} is not JSON: {exc}") from exc
    top = as_object(doc, where)
    if top.get("schema") != LEDGER_SCHEMA:
        raise ConfigError(f"{where}: schema is not {LEDGER_SCHEMA}")
    items = as_list(top.get("attempts"), f"{where}: attempts")
    if len(items) > LEDGER_ENTRIES_LIMIT:
        raise ConfigError(f"{where}: more than {LEDGER_ENTRIES_LIMIT} attempts")
    entries = tuple(
        _entry(as_object(item, f"{where}: attempts[{n}]"), f"{where}: attempts[{n}]")
        for n, item in enumerate(items)
    )
    if len({e.key for e in entries}) != len(entries):
        raise ConfigError(f"{where}: an attempt of an index is listed twice")
    return Ledger(
        run_id=_bounded(text(top.get("run_id"), f"{where}: run_id"), f"{where}: run_id"),
        deadline_started_unix=optional_number(
            top.get("deadline_started_unix"), f"{where}: deadline_started_unix"
        ),
        entries=tuple(sorted(entries, key=lambda e: e.key)),
        revision=_count(top.get("revision"), f"{where}: revision"),
    )


def _entry(doc: Mapping[str, object], where: str) -> LedgerEntry:
    index = doc.get("index")
    start = number(doc.get("start_unix"), f"{where}.start_unix")
    end = number(doc.get("end_unix"), f"{where}.end_unix")
    if end < start:
        raise ConfigError(f"{where}: end_unix is before start_unix")
    known = doc.get("lost_work_known")
    if not isinstance(known, bool):
        raise ConfigError(f"{where}.lost_work_known must be true or false")
    classification = optional_text(doc.get("classification"), f"{where}.classification")
    artifact = optional_text(doc.get("artifact"), f"{where}.artifact")
    rate = optional_number(doc.get("steps_per_s"), f"{where}.steps_per_s")
    if rate is not None and rate <= 0:
        raise ConfigError(f"{where}.steps_per_s must be above zero")
    node = optional_text(doc.get("node"), f"{where}.node")
    return LedgerEntry(
        attempt=_count(doc.get("attempt"), f"{where}.attempt", low=1),
        index=None if index is None else _count(index, f"{where}.index"),
        status=_bounded(text(doc.get("status"), f"{where}.status"), f"{where}.status"),
        classification=None
        if classification is None
        else _bounded(classification, f"{where}.classification"),
        start=start,
        end=end,
        phases=_phases(as_list(doc.get("phases"), f"{where}.phases"), start, end, where),
        lost_work_known=known,
        artifact=None if artifact is None else _bounded(artifact, f"{where}.artifact"),
        steps_per_s=rate,
        node=None if node is None else _bounded(node, f"{where}.node"),
    )


def _phases(items: Sequence[object], start: float, end: float, where: str) -> tuple[Phase, ...]:
    """Phases in order, within the attempt, never overlapping."""
    if len(items) > PHASES_LIMIT:
        raise ConfigError(f"{where}.phases: more than {PHASES_LIMIT}")
    phases: list[Phase] = []
    at = start
    for n, item in enumerate(items):
        if not isinstance(item, list) or len(item) != 3 or item[0] not in PHASES:
            raise ConfigError(f"{where}.phases[{n}] must be [kind, start_unix, seconds] of a known kind")
        kind: PhaseKind = item[0]
        begin = number(item[1], f"{where}.phases[{n}] start")
        stop = begin + number(item[2], f"{where}.phases[{n}] seconds")
        if begin < at - 1e-3 or stop > end + 1e-3:
            raise ConfigError(f"{where}.phases[{n}] overlaps another phase or lies outside the attempt")
        phases.append(Phase(kind, begin, stop))
        at = stop
    return tuple(phases)


def _count(value: object, where: str, *, low: int = 0) -> int:
    found = integer(value, where)
    if found < low:
        raise ConfigError(f"{where} must be at least {low}")
    return found


def _bounded(value: str, where: str) -> str:
    if len(value) > TEXT_LIMIT or not value.isprintable():
        raise ConfigError(f"{where} must be one printable line of at most {TEXT_LIMIT} characters")
    return value
