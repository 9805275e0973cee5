"""Size and update cost of a run's ledger (``ledger.json``) as attempts accumulate.

Each attempt has the eight phases a drained and resumed soak's attempt has; every other one failed
(evicted). One update is what each attempt's sidecar does once: parse the ledger read, add its entry,
compute the budget and serialise it. The baseline, in the same run, is ``json.loads`` plus
``json.dumps`` of the same bytes: the least any read-modify-write of that document costs.

    python bench/ledger.py [--attempts 100 1024 20000] [--reps 5] [--smoke]

``--smoke``: 10 attempts, one repetition, a check that the benchmark still runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sidecar.core.ledger.phases import PHASES, Phase
from sidecar.core.ledger.record import Ledger, LedgerEntry, dumps_ledger, parse_ledger, with_entry

T0 = 1_700_000_000.0
RUN = "0b6f3f3e-0d6c-4c7e-9d0e-2f1f3a6b7c8d"


def entry(attempt: int, index: int) -> LedgerEntry:
    start = T0 + (attempt - 1) * 4000.0 + index * 0.5
    phases, at = [], start
    for n, kind in enumerate(PHASES):
        seconds = 3000.0 + n / 7 if kind == "productive" else 20.0 + n / 3
        phases.append(Phase(kind, at, at + seconds))
        at += seconds
    failed = attempt % 2 == 1
    return LedgerEntry(
        attempt=attempt,
        index=index,
        status="failed" if failed else "passed",
        classification="evicted" if failed else None,
        start=start,
        end=at,
        phases=tuple(phases),
        artifact=f"s3://soaks/soak-sidecar/ml/nightly/{RUN}/index-{index}-attempt-{attempt}/artifact.json",
    )


def ledger_of(attempts: int) -> Ledger:
    indexes = max(1, min(8, attempts))
    built: Ledger | None = None
    for n in range(attempts):
        built = with_entry(built, entry(n // indexes + 1, n % indexes), run_id=RUN, deadline_started_unix=T0)
    assert built is not None
    return built


def one_update(data: bytes, new: LedgerEntry) -> bytes:
    ledger = with_entry(parse_ledger(data, "bench"), new, run_id=RUN, deadline_started_unix=T0)
    return dumps_ledger(ledger, now=T0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, nargs="+", default=[100, 1024, 20000], help="ledger sizes")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    parser.add_argument("--smoke", action="store_true", help="10 attempts, one repetition")
    args = parser.parse_args()
    sizes, reps = ([10], 1) if args.smoke else (args.attempts, args.reps)
    print(f"{'attempts':>9} {'bytes':>11} {'B/attempt':>10} {'update ms':>10} {'json ms':>8} {'ratio':>6}")
    for attempts in sizes:
        data = dumps_ledger(ledger_of(attempts - 1), now=T0) if attempts > 1 else b""
        new = entry(10**6, 0)
        update_s, baseline_s = [], []
        for _ in range(reps):
            started = time.perf_counter()
            written = one_update(data, new) if data else dumps_ledger(ledger_of(1), now=T0)
            update_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            json.dumps(json.loads(data or written))
            baseline_s.append(time.perf_counter() - started)
        update, baseline = statistics.median(update_s), statistics.median(baseline_s)
        print(
            f"{attempts:>9} {len(written):>11,} {len(written) / attempts:>10.0f} {update * 1000:>10.1f} "
            f"{baseline * 1000:>8.1f} {update / baseline:>6.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
