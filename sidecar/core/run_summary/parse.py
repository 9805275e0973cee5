"""Parsing ``run_summary.json``'s bytes: Python's ``json.loads`` (``NaN`` and ``Infinity`` parse,
so the finite-number checks reject them with a message that names the field), with limits on
size, encoding and nesting, and repeated keys refused."""

from __future__ import annotations

import json

from sidecar.core.errors import InvalidRunSummaryError
from sidecar.core.json_keys import DuplicateKeyError, refuse_duplicate_keys
from sidecar.core.run_summary.contract import clip

# Far deeper than the contract's documents; bounds every recursive walk of the trainer's data.
MAX_NESTING = 64


def _depth(value: object) -> int:
    """How deeply ``value`` nests lists and objects, counted without recursion."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        node, level = pending.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_NESTING:
            return deepest
        pending.extend((child, level + 1) for child in children)
    return deepest


def load_run_summary(data: bytes, *, max_bytes: int) -> object:
    """Parse run_summary.json (``NaN``/``Infinity`` parse; the checks reject them later).

    Raises ``InvalidRunSummaryError`` for an oversized, non-UTF-8, unparsable or too deeply
    nested document. A caller reading the file may stop after ``max_bytes + 1`` bytes.
    """
    if len(data) > max_bytes:
        raise InvalidRunSummaryError(f"run_summary.json exceeds the {max_bytes} byte limit")
    try:
        value = json.loads(data.decode("utf-8"), object_pairs_hook=refuse_duplicate_keys)
    except UnicodeDecodeError as exc:
        raise InvalidRunSummaryError(f"run_summary.json is not UTF-8: {exc}") from exc
    except RecursionError as exc:
        raise InvalidRunSummaryError("run_summary.json is nested too deeply to parse") from exc
    except DuplicateKeyError as exc:
        # Refused rather than keeping the last: a repeated key could hide a failing value.
        raise InvalidRunSummaryError(
            f"run_summary.json repeats the key {clip(exc.key)!r} in one object"
        ) from exc
    except ValueError as exc:  # JSONDecodeError, and integers over Python's digit limit
        raise InvalidRunSummaryError(f"run_summary.json is not valid JSON: {clip(str(exc))}") from exc
    if _depth(value) > MAX_NESTING:
        raise InvalidRunSummaryError(f"run_summary.json is nested deeper than {MAX_NESTING} levels")
    return value
