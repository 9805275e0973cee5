"""How soon the throughput rule (sidecar.core.throughput on sidecar.core.eta.StepTimes: the
step-time trend, Theil-Sen per hour with its 95 % interval) finds a trainer slowing down, and how
often it finds one that is not: a trainer sampled
every 5 s, its step time 0.5 s jittered by 10 % per step, growing ``--growth`` per hour; and
``--clean`` runs of the same trainer that does not slow down.

Prints the detection time (the first check at which the rule's finding, a note without a limit,
is raised, and stays so) against the 30-minute target, and the false positives among the clean runs.

    python bench/throughput_trend.py [--growth 0.2] [--clean 10] [--minutes 60] [--smoke]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sidecar.core.eta import StepTimes
from sidecar.core.throughput import ThroughputLimit, throughput_finding

TARGET_S = 30 * 60.0
CHECK_EVERY_S = 30.0  # as often as the sidecar fits the trend (sidecar.app.estimate)


def detection_s(growth: float, minutes: float, seed: int) -> float | None:
    """When the finding came for good; None if never within ``minutes``."""
    rng = random.Random(seed)
    times, t, step, next_sample, next_check = StepTimes(), 0.0, 0, 5.0, CHECK_EVERY_S
    seen: float | None = None
    while t < minutes * 60:
        t += 0.5 * (1 + growth * t / 3600) * rng.uniform(0.9, 1.1)
        step += 1
        if t >= next_sample:
            times.observe(t, step)
            next_sample += 5.0
        if t >= next_check:
            above = throughput_finding(times.pace(t), ThroughputLimit()) is not None
            seen = (seen or t) if above else None
            next_check += CHECK_EVERY_S
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--growth", type=float, default=0.2)
    parser.add_argument("--clean", type=int, default=10)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--smoke", action="store_true", help="short runs: a check that it still runs")
    args = parser.parse_args()
    if args.smoke:
        args.clean, args.minutes = 2, 10.0
    found = [detection_s(args.growth, args.minutes, seed) for seed in range(5)]
    detected = [s for s in found if s is not None]
    false = sum(detection_s(0.0, args.minutes, 100 + seed) is not None for seed in range(args.clean))
    print(f"step time growing {args.growth:.0%} an hour, 5 runs of {args.minutes:g} min, samples every 5 s")
    for seed, seconds in enumerate(found):
        shown = (
            "not seen"
            if seconds is None
            else f"{seconds / 60:.1f} min ({seconds / TARGET_S:.2f}x the 30 min target)"
        )
        print(f"  run {seed}: seen at {shown}")
    print(f"false positives: {false} of {args.clean} clean runs of {args.minutes:g} min")
    return 0 if len(detected) == len(found) or args.smoke else 1


if __name__ == "__main__":
    sys.exit(main())
