"""Reading a record's fields: typed, bounded, and a ProtocolError (never a crash) when they are not."""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping
from typing import Any


class ProtocolError(ValueError):
    """A run-dir record of the wrong shape. The sidecar turns it into its LauncherError."""


def get(raw: object, key: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
    """``raw[key]`` when it is of ``kind`` (never a bool for a number), None when optional and absent."""
    if not isinstance(raw, Mapping):
        raise ProtocolError(f"run dir record: an entry holding {key} is not an object ({raw!r:.80})")
    value = raw.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ProtocolError(f"run dir record: {key} has the wrong type ({value!r:.80})")
    if not isinstance(value, kind):
        raise ProtocolError(f"run dir record: {key} has the wrong type ({value!r:.80})")
    return value


def items(raw: Mapping[str, Any], key: str, kind: type) -> tuple[Any, ...]:
    """A list of plain ``kind`` values (never a bool for an int)."""
    found = get(raw, key, list, optional=True) or []
    for item in found:
        if isinstance(item, bool) or not isinstance(item, kind):
            problem = f"holds {item!r:.80}, which is not of type {kind.__name__}"
            raise ProtocolError(f"run dir record: {key} {problem}")
    return tuple(found)


def number(raw: Mapping[str, Any], key: str, *, optional: bool = False) -> float | None:
    value = get(raw, key, (int, float), optional=optional)
    if value is None:
        return None
    try:
        return float(value)
    except OverflowError:  # an integer of hundreds of digits
        raise ProtocolError(f"run dir record: {key} is out of range ({value!r:.40})") from None


def require_finite(record: str, key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProtocolError(f"{record}: {key} must be a finite number")


def signal_number(name: str) -> int:
    """SIGUSR1 / USR1 / 10 -> 10; ProtocolError (a ValueError) for anything else."""
    text = name.strip().upper()
    try:
        if text.isdigit():
            return int(signal.Signals(int(text)))
        return int(signal.Signals[text if text.startswith("SIG") else "SIG" + text])
    except (KeyError, ValueError):
        raise ProtocolError(f"unknown signal {name!r}") from None


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
