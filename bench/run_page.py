"""Render time of a whole run's page (``soak-sidecar report RUN_DIR``) for many attempts and indexes.

Synthetic artifacts (each attempt eight phases, every other one failed with lost work), parsed as the
report parses them, then ``render_run_report`` timed; the baseline, in the same run, is rendering one
attempt's own page (no samples) once per attempt, what the command writes beside the run's page.

    python bench/run_page.py [--attempts 100] [--indexes 8] [--reps 5] [--smoke]

``--smoke``: 5 attempts of 2 indexes, one repetition, a check that the benchmark still runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sidecar.core.report import render_report
from sidecar.core.report_input import ReportArtifact, parse_artifact
from sidecar.core.run_page import RunAttempt, render_run_report

T0 = 1_700_000_000.0
KINDS = (
    "scheduling",
    "container_start",
    "launcher",
    "startup",
    "productive",
    "lost_work",
    "checkpointing",
    "teardown",
)


def artifact(index: int, attempt: int) -> ReportArtifact:
    start = T0 + (attempt - 1) * 4000.0
    phases, at = [], start
    for n, kind in enumerate(KINDS):
        seconds = 3000.0 if kind == "productive" else 20.0 + n
        phases.append({"kind": kind, "start_unix": at, "seconds": seconds})
        at += seconds
    failed = attempt % 2 == 1
    doc = {
        "status": "failed" if failed else "passed",
        "failure_classification": "evicted" if failed else None,
        "exit_code": 17 if failed else 0,
        "context": {"run_id": "bench", "attempt": attempt, "index": index},
        "deadline": {"deadline_unix": T0 + 10**6, "started_unix": T0},
        "samples": {"samples_file": None},
        "phases": {"phases": phases, "lost_work_known": True},
    }
    return parse_artifact(json.dumps(doc).encode(), "bench")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=100, help="attempts in all (default 100)")
    parser.add_argument("--indexes", type=int, default=8, help="indexes they are spread over (default 8)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    parser.add_argument("--smoke", action="store_true", help="5 attempts, 2 indexes, one repetition")
    args = parser.parse_args()
    attempts, indexes, reps = (5, 2, 1) if args.smoke else (args.attempts, args.indexes, args.reps)
    runs = [
        RunAttempt(
            f"index-{n % indexes}-attempt-{n // indexes + 1}", artifact(n % indexes, n // indexes + 1), "x"
        )
        for n in range(attempts)
    ]
    page_s, own_s, size = [], [], 0
    for _ in range(reps):
        started = time.perf_counter()
        size = len(render_run_report("bench", runs).encode())
        page_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        for run in runs:
            render_report(run.artifact, [])
        own_s.append(time.perf_counter() - started)
    page, own = statistics.median(page_s), statistics.median(own_s)
    print(f"{attempts} attempts over {indexes} indexes, {reps} repetitions")
    print(f"run page: {page * 1000:.1f} ms median, {size / 1024:.0f} KiB")
    print(f"baseline, each attempt's own page (no samples): {own * 1000:.1f} ms median for all {attempts}")
    print(f"ratio run page / attempts' pages: {page / own:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
