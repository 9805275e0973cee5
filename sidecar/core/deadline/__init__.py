"""The persistent total-job deadline: record format (``record``), create-or-resume (``resume``),
and the attempt's clock (``clock``).

Pure: the store is injected (``sidecar.core.ports.DeadlineStore``) and every time is an argument.
Rules:

- one record per run identity, created exclusively and durably, resumed thereafter and never
  extended or re-created (a changed identity, budget or margin is refused);
- a corrupt, inconsistent or tampered record fails closed;
- an explicit resume never creates a fresh budget;
- remaining time is the minimum of wall-clock and monotonic remaining, so rolling the wall
  clock back cannot extend a running attempt;
- across attempts on the same boot, CLOCK_BOOTTIME anchored in the record bounds the elapsed
  time too: a wall clock set back between attempts is refused with the figures, never believed;
- nothing starts with the checkpoint margin or less left.

The caller holds ``store.lock(run_id)`` around ``obtain_record`` and for the rest of its life.
"""

from sidecar.core.deadline.clock import DeadlineClock, check_startable
from sidecar.core.deadline.record import (
    MAX_ATTEMPTS,
    MAX_RECORD_BYTES,
    RECORD_FORMAT,
    DeadlineRecord,
    encode_record,
    new_record,
    parse_record,
)
from sidecar.core.deadline.resume import LEDGER_SKEW_TOLERANCE_S, check_ledger, obtain_record

__all__ = [
    "LEDGER_SKEW_TOLERANCE_S",
    "MAX_ATTEMPTS",
    "MAX_RECORD_BYTES",
    "RECORD_FORMAT",
    "DeadlineClock",
    "DeadlineRecord",
    "check_ledger",
    "check_startable",
    "encode_record",
    "new_record",
    "obtain_record",
    "parse_record",
]
