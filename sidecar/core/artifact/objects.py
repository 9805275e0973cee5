"""The names of an attempt's files, in its local directory and under its prefix in the bucket."""

from __future__ import annotations

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
