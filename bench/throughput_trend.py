"""How soon the throughput rule (sidecar.core.throughput on sidecar.core.eta.StepTimes: the
step-time trend, Theil-Sen per hour with its 95 % interval) finds a trainer slowing down, and how
often it finds one that is not: a trainer sampled
every 5 s, its step time ``--step-s`` (0.5 s) jittered by 10 % per step, growing ``--growth`` per
hour; and ``--clean`` runs of the same trainer that does not slow down. Each sample is taken at the
end of the first step to end after its 5 s tick; with ``--grid`` on the tick itself, as the sidecar
samples: then a step longer than the interval (``--step-s 30``, a large model's) spans several
samples, and a short one is counted whole steps at a time (9 to 11 steps of 0.5 s per sample).

Prints the detection time (the first check at which the rule's finding, a note without a limit,
is raised, and stays so) against the 30-minute target, and the false positives among the clean runs.

    python bench/throughput_trend.py [--growth 0.2] [--step-s 0.5] [--grid] [--clean 10] [--minutes 60]
                                     [--smoke]
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


def detection_s(growth: float, minutes: float, seed: int, step_s: float, grid: bool) -> float | None:
    """When the finding came for good; None if never within ``minutes``."""
    rng = random.Random(seed)
    times, t, step, next_sample, next_check = StepTimes(), 0.0, 0, 5.0, CHECK_EVERY_S
    seen: float | None = None
    while t < minutes * 60:
        t += step_s * (1 + growth * t / 3600) * rng.uniform(0.9, 1.1)
        while grid and next_sample <= t:  # the samples taken while this step ran see the steps before it
            times.observe(next_sample, step)
            next_sample += 5.0
        step += 1
        if not grid and t >= next_sample:
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
    parser.add_argument("--step-s", type=float, default=0.5, help="the step time at the start (s)")
    parser.add_argument("--grid", action="store_true", help="sample on the 5 s ticks themselves")
    parser.add_argument("--clean", type=int, default=10)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--smoke", action="store_true", help="short runs: a check that it still runs")
    args = parser.parse_args()
    if args.smoke:
        args.clean, args.minutes = 2, 10.0
    found = [detection_s(args.growth, args.minutes, seed, args.step_s, args.grid) for seed in range(5)]
    detected = [s for s in found if s is not None]
    clean = [detection_s(0.0, args.minutes, 100 + seed, args.step_s, args.grid) for seed in range(args.clean)]
    false = sum(seconds is not None for seconds in clean)
    print(
        f"step time {args.step_s:g} s growing {args.growth:.0%} an hour, 5 runs of {args.minutes:g} min, "
        f"samples every 5 s{' on the tick' if args.grid else ''}"
    )
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
