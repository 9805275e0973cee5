"""CPU time per sample: our process-tree sampler against the seed's, measured in the same run.

Builds a tree of 64 processes (root -> 7 children -> 8 grandchildren each) that each hold 256 fds
of mixed classes, warms both samplers up, then measures ``time.process_time`` (user + system CPU
of this process) over alternating rounds of samples. Everything it starts is killed and reaped.

    python bench/sampler.py [--seed ../shared/bench/seed_sampler.py] [--samples 30] [--rounds 5] [--smoke]

``--smoke``: a 7-process tree of 32 fds each, 2 rounds of 3 samples, a check that it still runs.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from sidecar.adapters.procfs import FD_CLASS_REFRESH, ProcfsProcessTable
from sidecar.launcher.fdreport import FdReporter
from sidecar.launcher.proc import alive_descendants
from sidecar.launcher.protocol.files import atomic_write_json
from sidecar.launcher.protocol.names import FD_REPORT_FILE

REPO_ROOT = Path(__file__).resolve().parent.parent
PR_SET_CHILD_SUBREAPER = 36

# Runs in the tree: each node forks its share of the tree, then tops its fds up to the target
# with a cycle of classes, reports ready and sleeps until SIGTERM (which it passes down and reaps).
WORKER = r"""
import os, select, signal, socket, sys
fanout = [int(v) for v in sys.argv[1].split(",") if v]
target, ready, gap = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
kids = []
def stop(*_):
    for k in kids:
        os.kill(k, signal.SIGTERM)
    for k in kids:
        os.waitpid(k, 0)
    os._exit(0)
def node(levels):
    if levels:
        for _ in range(levels[0]):
            pid = os.fork()
            if pid == 0:
                kids.clear()
                try:
                    node(levels[1:])
                finally:
                    os._exit(0)
            kids.append(pid)
    signal.signal(signal.SIGTERM, stop)
    shm = f"/dev/shm/soak-bench-{os.getpid()}"
    keep = []
    def count():
        return len(os.listdir("/proc/self/fd")) - 1
    step = 0
    while count() < target:
        kind = step % 8
        step += 1
        if kind == 0:
            keep.extend(os.pipe())
        elif kind == 1:
            keep.extend(socket.socketpair())
        elif kind == 2:
            keep.append(os.memfd_create("bench"))
        elif kind == 3:
            keep.append(os.eventfd(0))
        elif kind == 4:
            keep.append(select.epoll())
        elif kind == 5:
            keep.append(os.open(shm, os.O_RDWR | os.O_CREAT, 0o600))
            os.unlink(shm)
        else:
            keep.append(os.open("/dev/null", os.O_RDONLY))
    if gap:
        # Close a low fd: the table is no longer 0..n-1, so the dense fast path cannot apply.
        os.close(keep.pop(0))
    os.write(ready, b"x")
    while True:
        signal.pause()
node(fanout)
"""


def load_seed(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("seed_sampler", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load the seed sampler from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def start_tree(fanout: list[int], fds: int, gaps: bool = False) -> tuple[subprocess.Popen[bytes], int]:
    expected = 1
    width = 1
    for branch in fanout:
        width *= branch
        expected += width
    ready_r, ready_w = os.pipe()
    root = subprocess.Popen(
        [
            sys.executable,
            "-c",
            WORKER,
            ",".join(map(str, fanout)),
            str(fds),
            str(ready_w),
            "1" if gaps else "0",
        ],
        pass_fds=(ready_w,),
        start_new_session=True,
    )
    os.close(ready_w)
    got = 0
    deadline = time.monotonic() + 120
    try:
        while got < expected:
            if not select.select([ready_r], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise SystemExit(f"tree not ready: {got}/{expected} processes reported")
            chunk = os.read(ready_r, 4096)
            if not chunk:
                raise SystemExit(f"tree died while starting: {got}/{expected} processes reported")
            got += len(chunk)
    except BaseException:
        stop_tree(root)
        raise
    finally:
        os.close(ready_r)
    return root, expected


def stop_tree(root: subprocess.Popen[bytes]) -> None:
    root.send_signal(signal.SIGTERM)
    try:
        root.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()
    # We are a subreaper: orphans of a forced stop come back to us; reap them all.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(root.pid, signal.SIGKILL)
    while True:
        try:
            pid, _ = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == 0:
            break


def interleaved_round(ours: Callable[[], Any], seed: Callable[[], Any], samples: int) -> tuple[float, float]:
    """CPU seconds per sample of each, alternating sample by sample so both see the same load."""
    ours_total = seed_total = 0.0
    clock = time.process_time
    for _ in range(samples):
        start = clock()
        ours()
        middle = clock()
        seed()
        seed_total += clock() - middle
        ours_total += middle - start
    return ours_total / samples, seed_total / samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seed", type=Path, default=REPO_ROOT.parent / "shared" / "bench" / "seed_sampler.py"
    )
    parser.add_argument("--samples", type=int, default=30, help="samples per round and sampler")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fds", type=int, default=256, help="fds per process")
    parser.add_argument("--fanout", default="7,8", help="children per level (7,8 -> 64 processes)")
    parser.add_argument(
        "--gaps", action="store_true", help="leave a hole in every fd table (no dense fast path)"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes: --fanout 2,2 --fds 32 --rounds 2 --samples 3"
    )
    args = parser.parse_args()
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(fanout="2,2", fds=32, rounds=2, samples=3)
        args = parser.parse_args()

    seed = load_seed(args.seed)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("prctl(PR_SET_CHILD_SUBREAPER) failed")

    fanout = [int(v) for v in args.fanout.split(",") if v]
    root, expected = start_tree(fanout, args.fds, args.gaps)
    try:
        ours = ProcfsProcessTable()
        # Every fd table read in full each sample: what a tree whose tables change all the time costs.
        full = ProcfsProcessTable(fd_class_refresh=1)
        mine = ours.sample(root.pid)
        theirs = seed.tree_snapshot(root.pid)
        print(
            f"tree: {expected} processes expected; ours sees {mine.process_count} processes, "
            f"{mine.fd_count_total} fds; seed sees {theirs['process_count']} processes, "
            f"{theirs['fd_count_total']} fds"
        )
        print(f"fd classes ours: {mine.fd_classes_total}")
        print(f"fd classes seed: {theirs['fd_classes_total']}")
        # The seed's "memfd:" rule never matches Linux's "/memfd:..." targets: it counts them as
        # "other"; fold ours the same way before comparing.
        folded = dict(mine.fd_classes_total)
        folded["other"] = folded.get("other", 0) + folded.pop("memfd", 0)
        if folded != theirs["fd_classes_total"] or mine.process_count != expected:
            print("MISMATCH between the samplers' views of the tree")
            return 1
        for _ in range(3):
            ours.sample(root.pid)
            full.sample(root.pid)
            seed.tree_snapshot(root.pid)
        with tempfile.TemporaryDirectory() as scratch:
            report = launcher_report(root.pid, Path(scratch) / FD_REPORT_FILE)
            measured = measure(
                {
                    "ours": lambda: ours.sample(root.pid),
                    "full": lambda: full.sample(root.pid),
                    "report": report,
                },
                lambda: seed.tree_snapshot(root.pid),
                rounds=args.rounds,
                samples=args.samples,
            )
    finally:
        stop_tree(root)

    print(f"rounds: {args.rounds} x {args.samples} samples each, interleaved; CPU ms/sample per round")
    summarise("ours", *measured["ours"], target=0.35)
    print(
        f"ours with every fd table read in full each sample (tables that change all the time; by "
        f"default a table whose fd count holds is read in full every {FD_CLASS_REFRESH} samples):"
    )
    summarise("full", *measured["full"], target=0.5)
    # The launcher's fds.json for a sidecar under another UID: the fd tables of the same tree.
    print("launcher fd report (fds.json), interleaved with the seed the same way:")
    summarise("report", *measured["report"], target=0.5)
    return 0


def measure(
    ours: dict[str, Callable[[], Any]], seed: Callable[[], Any], *, rounds: int, samples: int
) -> dict[str, tuple[list[float], list[float]]]:
    """Per sampler of ``ours``: its CPU s/sample per round and the seed's, interleaved with it."""
    measured: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in ours}
    for _ in range(rounds):
        for name, sample in ours.items():
            mine, theirs = interleaved_round(sample, seed, samples)
            measured[name][0].append(mine)
            measured[name][1].append(theirs)
    return measured


def summarise(name: str, mine: list[float], seed: list[float], *, target: float) -> None:
    ratios = [ours / theirs for ours, theirs in zip(mine, seed, strict=True)]
    print(f"  {name + ':':7}" + " ".join(f"{v * 1000:7.2f}" for v in mine))
    print("  seed:  " + " ".join(f"{v * 1000:7.2f}" for v in seed))
    print("  ratio: " + " ".join(f"{v:7.3f}" for v in ratios))
    print(
        f"median: {name} {statistics.median(mine) * 1000:.2f} ms/sample, "
        f"seed {statistics.median(seed) * 1000:.2f} ms/sample, "
        f"ratio {name}/seed {statistics.median(ratios):.3f} (target <= {target})"
    )


def launcher_report(root_pid: int, path: Path) -> Callable[[], None]:
    """What the launcher does per fd report: every process's fd table, written as fds.json. The
    tree's fd tables do not change here, so this measures the launcher's steady state: counts every
    report, classes every FD_CLASSES_EVERY."""
    reporter = FdReporter()

    def report() -> None:
        tables = reporter.tables([root_pid, *alive_descendants(root_pid)])
        atomic_write_json(str(path), {"processes": tables}, durable=False)

    return report


if __name__ == "__main__":
    sys.exit(main())
