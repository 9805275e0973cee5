"""The names of an attempt's files, in its local directory and under its prefix in the bucket."""

from __future__ import annotations

import re
from collections.abc import Iterable

ARTIFACT_FILE = "artifact.json"
SAMPLES_FILE = "samples.jsonl.gz"
# Uploaded while the attempt runs (sidecar.app.evidence): its provisional artifact, a new object
# per record, and the segments of its samples and console, numbered in order.
PROVISIONAL_PREFIX = "provisional-"
SEGMENT_MARK = ".seg-"
CONSOLE_STEM = "console.log"


def provisional_name(number: int) -> str:
    return f"{PROVISIONAL_PREFIX}{number:04d}.json"


def segment_name(stem: str, number: int) -> str:
    return f"{stem}{SEGMENT_MARK}{number:06d}"


_PROVISIONAL = re.compile(re.escape(PROVISIONAL_PREFIX) + r"([0-9]{4,9})\.json")


def provisional_number(name: str) -> int | None:
    """The number of a provisional record's object name; None for any other name."""
    found = _PROVISIONAL.fullmatch(name)
    return None if found is None else int(found.group(1))


def newest_provisional(names: Iterable[str]) -> str | None:
    """The provisional record numbered highest among ``names`` (by number, not by text)."""
    numbered = [(number, name) for name in names if (number := provisional_number(name)) is not None]
    return max(numbered)[1] if numbered else None
