"""The trainer's optional checkpoint record (pure): ``checkpoint.json`` in the progress dir.

    {"step": 1200, "path": "ckpt/step-1200", "bytes": 7340032, "duration_s": 4.2}

``step`` is required; the rest is optional. It is a claim of the trainer: the sidecar takes from it
only *that* a new checkpoint was reported (the record changed) and when it saw that (its own
clock, at the sample), never a time the trainer wrote. Without one the ledger says "no checkpoint
reported" instead of guessing the lost work.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from sidecar.core.errors import ConfigError
from soak_sidecar_kit import contract

# The trainer contract (soak_sidecar_kit.contract) defines the record; the kit writes by it.
CHECKPOINT_FILE = contract.CHECKPOINT_FILE
CHECKPOINT_LIMIT_BYTES = contract.CHECKPOINT_LIMIT_BYTES
PATH_CHARS = contract.PATH_CHARS
MAX_INTEGER = contract.MAX_INTEGER


@dataclass(frozen=True)
class CheckpointReport:
    step: int
    path: str | None = None
    bytes: int | None = None
    duration_s: float | None = None


def parse_checkpoint(data: bytes) -> CheckpointReport:
    """The record, or ConfigError saying what is wrong with it (one line)."""
    if len(data) > CHECKPOINT_LIMIT_BYTES:
        raise ConfigError(f"{CHECKPOINT_FILE} is larger than {CHECKPOINT_LIMIT_BYTES} bytes")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{CHECKPOINT_FILE} is not JSON") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{CHECKPOINT_FILE} is not a JSON object")
    path, duration = doc.get("path"), doc.get("duration_s")
    if path is not None and (not isinstance(path, str) or len(path) > PATH_CHARS):
        raise ConfigError(f"{CHECKPOINT_FILE}: path must be text of at most {PATH_CHARS} characters")
    if duration is not None and (
        isinstance(duration, bool) or not isinstance(duration, (int, float)) or not 0 <= duration < math.inf
    ):
        raise ConfigError(f"{CHECKPOINT_FILE}: duration_s must be a finite number >= 0")
    return CheckpointReport(
        step=_count(doc.get("step"), "step"),
        path=path,
        bytes=None if doc.get("bytes") is None else _count(doc["bytes"], "bytes"),
        duration_s=None if duration is None else float(duration),
    )


def _count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INTEGER:
        raise ConfigError(f"{CHECKPOINT_FILE}: {name} must be an integer >= 0")
    return value
