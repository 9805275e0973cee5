"""What a hostile command line costs the sampler, and how long it can stall another thread.

Starts a tree of sleeping processes whose argv is ~1 MB each (hex arguments of 100 KB: what a trainer
may pass, on purpose or not) and, in the same run, the same tree with a short benign argv. For each,
times a sample of the real process-table adapter with an empty command cache (every command line
new, as when a trainer starts new workers each sample) while a ticker thread records the longest gap
between its 5 ms ticks: the stall the heartbeat and metrics threads would see. The sampler of the
commit before command-line reads were bounded (read from git history) is measured too, on the same
hostile tree. Prints measured figures only; everything it starts is killed and reaped.

    python bench/hostile_argv.py [--processes 20] [--repeat 5] [--smoke]

``--smoke``: 3 processes, one repeat, a check that the benchmark still runs (figures only).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from _history import module_at

from sidecar.adapters.procfs import ProcfsProcessTable

REPO = Path(__file__).resolve().parents[1]
# The last commit whose sampler read a process's whole command line.
BASELINE_COMMIT = "e069919"
SLEEPER = "import os, time; os.close(1); time.sleep(600)"
HOSTILE_ARGS = ["--data", *(f"{i:x}" + "0123456789abcdef" * 6_250 for i in range(10))]
BENIGN_ARGS = ["--lr", "0.1", "--epochs", "3"]

Sampler = Callable[[int], object]


def baseline_table() -> Sampler:
    module = module_at(BASELINE_COMMIT, "sidecar/adapters/procfs.py")
    return lambda root: module.ProcfsProcessTable().sample(root)  # an empty cache, as fresh() in main


@contextmanager
def tree(count: int, args: list[str]) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen([sys.executable, "-c", SLEEPER, *args], stdout=subprocess.PIPE))
        for proc in procs:  # each closes its stdout once started: a handshake, not a sleep
            assert proc.stdout is not None
            proc.stdout.read()
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def timed(sample: Callable[[], object]) -> tuple[float, float]:
    """Milliseconds one sample took, and the longest gap between a 5 ms ticker's ticks meanwhile."""
    ticks: list[float] = []
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.005)

    thread = threading.Thread(target=ticker)
    thread.start()
    time.sleep(0.02)
    start = time.monotonic()
    sample()
    took = time.monotonic() - start
    stop.set()
    thread.join()
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    return took * 1000, max(gaps) * 1000


def measure(sample: Sampler, repeat: int) -> tuple[float, float]:
    runs = [timed(lambda: sample(os.getpid())) for _ in range(repeat)]
    return statistics.median(r[0] for r in runs), max(r[1] for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    count, repeat = (3, 1) if args.smoke else (args.processes, args.repeat)
    argv_kb = sum(len(a) + 1 for a in HOSTILE_ARGS) / 1000

    def fresh(root: int) -> object:  # an empty command cache: every command line is new
        return ProcfsProcessTable().sample(root)

    rows: list[tuple[str, float, float]] = []
    with tree(count, BENIGN_ARGS):
        rows.append(("benign argv, current sampler", *measure(fresh, repeat)))
    with tree(count, HOSTILE_ARGS):
        rows.append(("hostile argv, current sampler", *measure(fresh, repeat)))
        rows.append((f"hostile argv, sampler of {BASELINE_COMMIT}", *measure(baseline_table(), repeat)))
    print(f"{count} processes, hostile argv {argv_kb:.0f} kB each, median of {repeat} samples")
    print(f"{'':40} {'sample ms':>10} {'max tick gap ms':>16}")
    for name, took, gap in rows:
        print(f"{name:40} {took:10.1f} {gap:16.1f}")
    benign, current, baseline = rows
    print(f"hostile/benign sample time (current): {current[1] / benign[1]:.2f}x")
    print(f"baseline/current sample time (hostile): {baseline[1] / current[1]:.2f}x")


if __name__ == "__main__":
    main()
