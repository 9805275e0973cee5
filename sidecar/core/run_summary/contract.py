"""The contract's constants, and how its checks read and quote the trainer's values."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

SUPPORTED_METRIC_SCHEMA_VERSION = 1
SUPPORTED_RUNTIME_MANIFEST_SCHEMA_VERSION = 2

SHUTDOWN_CLASSIFICATIONS: tuple[str, ...] = (
    "normal_completion",
    "learner_failure",
    "collector_failure",
    "backend_worker_failure",
    "timeout/stale_tick",
    "external_cancellation",
    "unknown_failure",
)
# What a run_summary alone can be classified as, besides the trainer's own shutdown classification.
SUMMARY_CLASSIFICATIONS: tuple[str, ...] = (
    "missing_run_summary",
    "invalid_run_summary",
    "stale_run_summary",
    "schema_violation",
    "shutdown_contract_violation",
    "unknown_failure",
)
REPLAY_INGRESS_INTEGER_FIELDS: tuple[str, ...] = (
    "ingress_depth",
    "ingress_slot_rows",
    "published_sequence",
    "release_sequence",
    "occupancy",
    "high_water_occupancy",
    "backpressure_waits",
    "early_returns",
    "dropped_batches",
    "closed_returns",
    "stop_returns",
)

_MAX_SHOWN = 500


def clip(text: str) -> str:
    """A message fragment shortened so one huge value cannot flood the reason."""
    return text if len(text) <= _MAX_SHOWN else f"{text[: _MAX_SHOWN - 3]}..."


def show(value: object) -> str:
    """A value as messages quote it: its ``repr``, shortened."""
    return clip(repr(value))


def finite_number(value: object) -> float | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond float range is not a finite number either
        return None
    return number if math.isfinite(number) else None


def integer(value: object) -> int | None:
    """The value as an int if it is finite and integral (``3.0`` counts, ``True`` does not);
    exact for ints, whatever their size."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    number = finite_number(value)
    if number is None or not number.is_integer():
        return None
    return int(number)


def mapping(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None
