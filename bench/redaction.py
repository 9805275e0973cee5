"""Redaction cost of a hostile argument: a long hex run (what a trainer may pass on its command line).

Compared in the same run against the redactor before its patterns were bounded (read from git
history: the last commit that had it), which is quadratic in an argument's length. The baseline
stops at the sizes it finishes in seconds; the current redactor is also timed at 1 MB. Prints
measured figures only.

    python bench/redaction.py [--repeat 5] [--smoke]

``--smoke``: small sizes, one repeat, a check that the benchmark still runs (figures only).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from _history import module_at

from sidecar.core.redaction import redact_command

REPO = Path(__file__).resolve().parents[1]
# The last commit whose redactor had unbounded patterns.
BASELINE_COMMIT = "800ecf1"

Redactor = Callable[[Sequence[str]], tuple[str, ...]]


def baseline_redactor() -> Redactor:
    redactor: Redactor = module_at(BASELINE_COMMIT, "sidecar/core/redaction.py").redact_command
    return redactor


def hostile(size: int) -> str:
    return "a" + "0123456789abcdef" * (size // 16)


def median_ms(redactor: Redactor, argument: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        redactor(["python3", "train.py", argument])
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    repeat = 1 if args.smoke else args.repeat
    both = [1_000, 4_000] if args.smoke else [1_000, 4_000, 16_000, 32_000]
    current_only = [100_000] if args.smoke else [100_000, 1_000_000]
    baseline = baseline_redactor()
    print(f"redaction of one hostile argument (hex run), median of {repeat} (ms)")
    print(f"{'bytes':>10} {'baseline':>10} {'current':>10} {'ratio':>8}")
    for size in both:
        argument = hostile(size)
        old, new = median_ms(baseline, argument, repeat), median_ms(redact_command, argument, repeat)
        print(f"{size:>10} {old:>10.2f} {new:>10.3f} {old / new:>8.0f}")
    for size in current_only:
        print(f"{size:>10} {'(too slow)':>10} {median_ms(redact_command, hostile(size), repeat):>10.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
