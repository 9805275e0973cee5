"""Deadline enforcement latency: from the deadline instant until the last trainer process is gone.

The trainer ignores SIGTERM (and the soft-stop signal) and has a child that does too, so only
the KILL at the deadline ends them. "Gone" means reaped: no /proc entry left for either PID.

Compared in the same run (interleaved) against a baseline that reimplements the seed's guardian
(``_guard_job``: a 100 ms ``time.sleep`` polling loop, ``killpg(SIGKILL)`` + ``wait()``, then the
guardian's 10 ms reap loop for adopted children). Prints measured figures only.

    python bench/deadline.py [--runs 20] [--lead-s 2.0] [--smoke]

``--smoke``: one run with a 1.5 s lead, a check that the benchmark still runs (figures only).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sidecar.adapters.rundir.channel import RunDir
from sidecar.adapters.rundir.zipapp import launcher_path
from sidecar.launcher.protocol.go import GoRequest

TRAINER = """
import os, signal, subprocess, sys, time
for s in (signal.SIGTERM, signal.SIGUSR1):
    signal.signal(s, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time\\n"
    "for s in (signal.SIGTERM, signal.SIGUSR1):\\n"
    "    signal.signal(s, signal.SIG_IGN)\\n"
    "time.sleep(600)"])
with open(sys.argv[1] + ".tmp", "w") as fh:
    fh.write(f"{os.getpid()} {child.pid}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    time.sleep(1)
"""

# The seed's guardian_main + _guard_job, kept to their logic (subreaper, 100 ms polling loop,
# TERM at term_grace remaining (the seed's fixed 5 s, here the same grace as ours),
# killpg KILL + wait, then a 10 ms reap loop).
BASELINE = """
import ctypes, json, os, signal, subprocess, sys, time
deadline_unix, term_grace, command = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "subreaper unavailable")
monotonic_end = time.monotonic() + max(0, deadline_unix - time.time())
def remaining():
    return min(deadline_unix - time.time(), monotonic_end - time.monotonic())
process = None; term = False
try:
    process = subprocess.Popen(command, start_new_session=True, stdout=sys.stderr)
    while True:
        left = remaining()
        if left <= 0:
            break
        if process.poll() is not None:
            break
        if left <= term_grace and not term:
            os.killpg(process.pid, signal.SIGTERM); term = True
        time.sleep(min(.1, max(.001, left)))
finally:
    if process is not None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
    until = time.monotonic() + 2
    while time.monotonic() < until:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(.01)
"""


def _wait_pids(pid_file: Path, deadline_unix: float) -> tuple[int, ...]:
    while not pid_file.exists():
        if time.time() > deadline_unix - 0.2:
            raise RuntimeError("trainer did not start well before the deadline; raise --lead-s")
        time.sleep(0.005)
    return tuple(int(p) for p in pid_file.read_text().split())


def _gone_after(pids: tuple[int, ...], deadline_unix: float) -> float:
    """Seconds from the deadline until none of pids has a /proc entry (polled every 0.25 ms)."""
    time.sleep(max(0.0, deadline_unix - time.time() - 0.02))
    while any(os.path.exists(f"/proc/{pid}") for pid in pids):
        time.sleep(0.00025)
    return time.time() - deadline_unix


def run_ours(work: Path, lead_s: float) -> float:
    rd = RunDir(work / "run")
    rd.reset()
    pid_file = work / "pids"
    pid_file.unlink(missing_ok=True)
    trainer = work / "trainer.py"
    proc = subprocess.Popen(
        [
            *(sys.executable, str(launcher_path()), "--run-dir", str(rd.path), "--"),
            *(sys.executable, str(trainer), str(pid_file)),
        ],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        rd.wait_for_launcher(30)
        deadline = time.time() + lead_s
        rd.give_go(
            GoRequest(
                launch_id=str(rd.launch_id),
                deadline_unix=deadline,
                checkpoint_margin_s=lead_s / 2,
                term_grace_s=lead_s / 4,
                heartbeat_timeout_s=600,
                kill_grace_s=1,
                console_log_bytes=1 << 20,
            )
        )
        latency = _gone_after(_wait_pids(pid_file, deadline), deadline)
        proc.wait(timeout=30)
        return latency
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_baseline(work: Path, lead_s: float) -> float:
    pid_file = work / "pids"
    pid_file.unlink(missing_ok=True)
    # One more interpreter start than ours before the trainer runs (ours is already up at go).
    deadline = time.time() + lead_s + 1.0
    proc = subprocess.Popen(
        [
            *(sys.executable, "-c", BASELINE, repr(deadline), repr(lead_s / 4)),
            *(sys.executable, str(work / "trainer.py"), str(pid_file)),
        ],
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        latency = _gone_after(_wait_pids(pid_file, deadline), deadline)
        proc.wait(timeout=30)
        return latency
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _summary(name: str, samples: list[float]) -> tuple[float, float]:
    ms = sorted(s * 1000 for s in samples)
    median, worst = statistics.median(ms), ms[-1]
    print(
        f"{name:<22} n={len(ms):<3} median {median:7.2f} ms   "
        f"p90 {ms[int(0.9 * (len(ms) - 1))]:7.2f} ms   max {worst:7.2f} ms   min {ms[0]:7.2f} ms"
    )
    return median, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--lead-s", type=float, default=2.0, help="go -> deadline, seconds")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: --runs 1 --lead-s 1.5")
    args = parser.parse_args()
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(runs=1, lead_s=1.5)
        args = parser.parse_args()
    ours: list[float] = []
    base: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-deadline-") as tmp:
        work = Path(tmp)
        (work / "trainer.py").write_text(TRAINER)
        for i in range(args.runs):
            ours.append(run_ours(work, args.lead_s))
            base.append(run_baseline(work, args.lead_s))
            print(
                f"run {i + 1:2d}: launcher {ours[-1] * 1000:7.2f} ms   seed loop {base[-1] * 1000:7.2f} ms",
                flush=True,
            )
    print()
    print("latency from the deadline until the trainer and its child are reaped")
    our_median, our_max = _summary("launcher (ours)", ours)
    base_median, base_max = _summary("seed 100 ms loop", base)
    print(f"ratio seed/ours: median {base_median / our_median:.2f}x, max {base_max / our_max:.2f}x")
    print(
        f"target median < 20 ms: {'met' if our_median < 20 else 'MISSED'}; "
        f"max < 100 ms: {'met' if our_max < 100 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
