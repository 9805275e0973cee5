"""Structured progress: the trainer's ``progress.jsonl`` records, one validating parser. Pure.

Any trainer can write them, with or without the kit (``soak_sidecar_kit``): one JSON object per
line, appended, each at most ``RECORD_LINE_LIMIT`` bytes:

    {"step": 120, "phase": "train", "samples": 3840, "tokens": 1966080, "loss": 2.31, "total_steps": 5000}

``step`` (an integer from 0) is required; ``phase`` is one of ``PHASES`` (default ``train``);
``samples`` and ``tokens`` (cumulative counts), ``loss`` (a number or null) and ``total_steps``
(the run's declared end, an integer from 1) are optional. Other keys (the kit's ``t``) are ignored:
the sidecar times every record on its own clock, when a sample first sees it. A record is the
trainer's claim: it never names a pid and never skips a check; it sets which phase's stale timeout
applies and what the finish is estimated from.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Literal, cast

from sidecar.core.errors import ConfigError
from sidecar.core.json_keys import refuse_duplicate_keys
from soak_sidecar_kit import contract

# The trainer contract (soak_sidecar_kit.contract) is the one definition of the file, its fields
# and bounds; the kit writes by it.
PROGRESS_RECORDS_FILE = contract.PROGRESS_RECORDS_FILE
Phase = Literal["train", "eval", "checkpoint", "data", "compile"]
PHASES: tuple[Phase, ...] = cast("tuple[Phase, ...]", contract.PHASES)
RECORD_LINE_LIMIT = contract.RECORD_LINE_LIMIT
MAX_COUNT = contract.MAX_COUNT


@dataclass(frozen=True)
class ProgressRecord:
    step: int
    phase: Phase = "train"
    samples: float | None = None
    tokens: float | None = None
    loss: float | None = None
    total_steps: int | None = None


def parse_record(line: bytes) -> ProgressRecord:
    """One line of progress.jsonl; ConfigError saying what is wrong with it."""
    if len(line) > RECORD_LINE_LIMIT:
        raise ConfigError(f"a progress record is longer than {RECORD_LINE_LIMIT} bytes")
    try:
        value = json.loads(line, object_pairs_hook=refuse_duplicate_keys)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ConfigError(f"a progress record is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError("a progress record must be a JSON object")
    phase = value.get("phase", "train")
    if phase not in PHASES:
        raise ConfigError(f"a progress record's phase must be one of {', '.join(PHASES)}")
    return ProgressRecord(
        step=_count(value.get("step"), "step", low=0),
        phase=cast(Phase, phase),
        samples=_optional_number(value.get("samples"), "samples"),
        tokens=_optional_number(value.get("tokens"), "tokens"),
        loss=_loss(value.get("loss")),
        total_steps=None
        if value.get("total_steps") is None
        else _count(value["total_steps"], "total_steps", low=1),
    )


def _count(value: object, name: str, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_COUNT:
        raise ConfigError(f"a progress record's {name} must be an integer from {low} to 2**53")
    return value


def _optional_number(value: object, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_COUNT:
        raise ConfigError(f"a progress record's {name} must be a number from 0 to 2**53")
    return float(value)


def _loss(value: object) -> float | None:
    """A loss the trainer could not compute is null; an absurd one is refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError("a progress record's loss must be a finite number or null")
    return float(value)


@dataclass(frozen=True)
class RecordsRead:
    """What one read of new lines found: the newest valid record, and how many lines newer than it
    were refused (older lines it supersedes are not parsed)."""

    newest: ProgressRecord | None
    refused: int
    # The newest refusal's reason, for the artifact (one line).
    first_refusal: str | None = None


# Lines parsed per read at most, newest first: a trainer writing floods of junk costs the sidecar
# this many parses a sample, not one per line it wrote.
MAX_PARSED_LINES = 1024


def read_records(chunk: bytes) -> RecordsRead:
    """The complete lines of ``chunk`` (it ends at a newline: the caller keeps a partial last line),
    newest first until a valid record: only the newest counts. Past MAX_PARSED_LINES the older
    lines are counted as refused without parsing."""
    refused = 0
    why: str | None = None
    lines = [line for line in chunk.split(b"\n") if line.strip()]
    for parsed, line in enumerate(reversed(lines)):
        if parsed >= MAX_PARSED_LINES:
            return RecordsRead(None, refused + len(lines) - parsed, why)
        try:
            return RecordsRead(parse_record(line), refused, why)
        except ConfigError as exc:
            refused += 1
            why = why or str(exc)
    return RecordsRead(None, refused, why)
