"""What the trainer's shape costs the sidecar: its peak RSS and the evidence per sample, for a tree of
many processes with long command lines against the same sidecar supervising a small tree.

Each run is ``soak-sidecar run --local`` over a trainer that starts N children, each with a
distinct command line of ARGV_KIB KiB (``sh -c 'read x'`` blocked on a pipe: a real process that
costs little), makes progress for ``--seconds``, then lets its children go and passes. The
benchmark reads the sidecar's VmHWM from /proc while it runs (its own peak, not its children's),
and the size of ``samples.jsonl.gz`` over the samples it holds.

    python bench/tree_footprint.py [--counts 10,1000,10000] [--argv-kib 16] [--seconds 20] [--smoke]

Prints, per process count: the sidecar's peak RSS, its ratio to the smallest tree's (the baseline,
measured in the same run), samples taken, compressed and raw bytes per sample, and the samples'
size per day at the default 5 s interval.
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_INTERVAL_S = 5.0
SAMPLES_PER_DAY = 86_400 / DEFAULT_INTERVAL_S

TRAINER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from pathlib import Path
    from sidecar.examples.replay_summary import run_summary, write_atomic
    count, argv_kib, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    progress = Path(os.environ["SOAK_PROGRESS_DIR"])
    children = []
    for index in range(count):
        filler = (f"{index:08x}" * (argv_kib * 128))[: argv_kib * 1024]
        command = ["sh", "-c", "read x", f"worker-{index}", filler]
        children.append(subprocess.Popen(command, stdin=subprocess.PIPE))
    end, step = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        step += 1
        (progress / "step").write_text(str(step))
        time.sleep(0.5)
    for child in children:
        child.stdin.close()
    for child in children:
        child.wait()
    write_atomic(progress / "run_summary.json",
                 run_summary(steps=step, completed=True, classification="normal_completion", error=None))
    """
)


@dataclass(frozen=True)
class Result:
    count: int
    peak_rss_kib: int
    exit_code: int
    samples: int
    gz_bytes: int
    raw_bytes: int


def vm_hwm_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
    except (OSError, StopIteration):
        return None


def run_once(count: int, argv_kib: int, seconds: float, interval_s: float) -> Result:
    with tempfile.TemporaryDirectory(prefix="soak-tree-") as tmp:
        argv = [
            sys.executable, "-m", "sidecar.cli", "run", "--local", "--output", str(Path(tmp) / "out"),
            "--sample-interval", str(interval_s), "--startup-timeout", "600", "--stale-progress", "600",
            "--post-shutdown-grace", "0.5",
            "--", sys.executable, "-c", TRAINER, str(count), str(argv_kib), str(seconds),
        ]  # fmt: skip
        env = {**os.environ, "SOAK_MONITOR__STATUS_LINE": "off", "PYTHONPATH": str(REPO)}
        sidecar = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        peak = 0
        while sidecar.poll() is None:
            peak = max(peak, vm_hwm_kib(sidecar.pid) or 0)
            time.sleep(0.2)
        _, err = sidecar.communicate()
        if sidecar.returncode != 0:
            print(err.decode(errors="replace")[-2000:], file=sys.stderr)
        (samples,) = Path(tmp, "out", "runs").glob("*/attempt-1/samples.jsonl.gz")
        raw = gzip.decompress(samples.read_bytes())
        return Result(count, peak, sidecar.returncode, raw.count(b"\n"), samples.stat().st_size, len(raw))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="10,1000,10000", help="process counts, the first the baseline")
    parser.add_argument("--argv-kib", type=int, default=16, help="KiB of command line per process")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the tree stays up")
    parser.add_argument("--interval", type=float, default=2.0, help="the sidecar's sample interval (s)")
    parser.add_argument(
        "--smoke", action="store_true", help="10 and 100 processes, 4 s: a check that it runs"
    )
    args = parser.parse_args()
    counts = [10, 100] if args.smoke else [int(c) for c in args.counts.split(",")]
    seconds = 4.0 if args.smoke else args.seconds
    results = [run_once(count, args.argv_kib, seconds, args.interval) for count in counts]
    base = results[0]
    print(f"{'processes':>9} {'peak RSS':>10} {'vs base':>8} {'exit':>4} {'samples':>7} "
          f"{'gz B/sample':>11} {'raw B/sample':>12} {'gz MB/day @5s':>13}")  # fmt: skip
    for r in results:
        per_gz = r.gz_bytes / max(1, r.samples)
        print(
            f"{r.count:>9} {r.peak_rss_kib / 1024:>8.1f}Mi {r.peak_rss_kib / base.peak_rss_kib:>7.2f}x "
            f"{r.exit_code:>4} {r.samples:>7} {per_gz:>11.0f} {r.raw_bytes / max(1, r.samples):>12.0f} "
            f"{per_gz * SAMPLES_PER_DAY / 1e6:>13.1f}"
        )
    print(f"argv {args.argv_kib} KiB per process, sample interval {args.interval:g} s, {seconds:g} s up")


if __name__ == "__main__":
    main()
