"""The one ``object_pairs_hook`` that refuses a JSON object repeating a key (pure).

``json.loads`` keeps the last of two equal keys, so ``{"status": "failed", ..., "status":
"completed"}`` would read as completed: documents the sidecar judges are parsed with this hook.
"""

from __future__ import annotations

from typing import Any


class DuplicateKeyError(ValueError):
    """A JSON object names ``key`` twice."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for ``json.loads``: the object, or DuplicateKeyError."""
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise DuplicateKeyError(key)
        document[key] = value
    return document
