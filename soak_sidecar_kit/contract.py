"""The trainer contract: the files a trainer writes for soak-sidecar, their fields and their bounds.

One definition for both sides: the kit (``soak_sidecar_kit``) writes by it, and the sidecar's parsers
(``sidecar.core.progress_records``, ``sidecar.core.ledger.checkpoint``, the run_summary reader) judge
by it. Pure data, standard library only, Python 3.9+: it ships beside the launcher with the kit.

All three files live in ``$SOAK_PROGRESS_DIR``:

- ``progress.jsonl``: appended, one JSON object per line of at most ``RECORD_LINE_LIMIT`` bytes:
  ``step`` (required, an integer from 0 to ``MAX_COUNT``), ``phase`` (one of ``PHASES``, default
  ``train``), ``samples`` and ``tokens`` (cumulative counts from 0 to ``MAX_COUNT``), ``loss`` (a
  finite number or null), ``total_steps`` (the run's declared end, an integer from 1). Other keys
  are ignored. The newest valid record sets the phase whose stale timeout applies.
- ``checkpoint.json``: the newest checkpoint complete on disk, at most ``CHECKPOINT_LIMIT_BYTES``:
  ``step`` (required, an integer from 0 to ``MAX_INTEGER``), ``path`` (text of at most
  ``PATH_CHARS``), ``bytes`` (an integer from 0), ``duration_s`` (a finite number from 0).
- ``run_summary.json``: the run's final document, written whole (a temp file, then one rename);
  ``soak-sidecar schema run-summary`` describes its profiles.
"""

from __future__ import annotations

PROGRESS_RECORDS_FILE = "progress.jsonl"
CHECKPOINT_FILE = "checkpoint.json"
SUMMARY_FILE = "run_summary.json"

PHASES = ("train", "eval", "checkpoint", "data", "compile")
TRAIN = "train"

# progress.jsonl
RECORD_LINE_LIMIT = 4096
# Far beyond any real count, within a float's exact integers.
MAX_COUNT = 2**53

# checkpoint.json
CHECKPOINT_LIMIT_BYTES = 64 * 1024
PATH_CHARS = 4096
MAX_INTEGER = 2**63 - 1
