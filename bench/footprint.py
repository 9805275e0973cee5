"""The sidecar's footprint: how fast its commands start, and what it holds while a soak runs.

1. Start-up of the commands a user or a probe runs most (``--help``, ``exit-codes``,
   ``validate --help``, ``run --help``): median wall time and peak RSS over ``--reps`` runs each,
   interleaved with the baseline of the same run, a bare ``python3 -c pass``.
2. The sidecar's steady state: ``soak-sidecar run --local`` supervising a real torchrun job (two
   gloo ranks with DataLoader workers; the bundled example trainer without ``--python``), its own
   RSS and CPU over ``--window`` seconds once the trainer makes progress, against a bare Python
   process that imported the same engine (``sidecar.app.*``, boto3, pydantic, psutil,
   prometheus_client) and sits idle: the RSS ratio is what the work adds to the libraries.

    python bench/footprint.py [--reps 10] [--window 60] [--python TRAINER_VENV_PYTHON] [--smoke]

``--smoke``: 2 runs each and a 5 s window over the example trainer, a check that it still runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {
    "bare python3 -c pass": ["-c", "pass"],
    "soak-sidecar --help": ["-m", "sidecar.cli", "--help"],
    "soak-sidecar exit-codes": ["-m", "sidecar.cli", "exit-codes"],
    "soak-sidecar validate --help": ["-m", "sidecar.cli", "validate", "--help"],
    "soak-sidecar run --help": ["-m", "sidecar.cli", "run", "--help"],
}
# What the sidecar has loaded once it supervises: its engine and the libraries behind it.
ENGINE = (
    "import sidecar.commands.run, sidecar.app.supervisor, sidecar.app.wiring, sidecar.adapters.procfs, "
    "sidecar.adapters.s3_sink, sidecar.adapters.metrics, boto3, prometheus_client, signal; "
    "open(__import__('sys').argv[1], 'w').close(); signal.pause()"
)


# Runs a command's argv and writes the process's VmHWM (KiB) at exit: the peak RSS of this
# program alone (a child's ru_maxrss would count the benchmark's own pages it was forked with).
PEAK = """
import atexit, runpy, sys
out = sys.argv.pop(1)
def peak():
    with open("/proc/self/status") as status:
        kib = next(line.split()[1] for line in status if line.startswith("VmHWM"))
    with open(out, "w") as file:
        file.write(kib)
atexit.register(peak)
if sys.argv[1] == "-c":
    exec(sys.argv[2])
else:
    sys.argv = sys.argv[2:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def run_once(argv: list[str]) -> float:
    """Wall seconds of one run."""
    started = time.perf_counter()
    subprocess.run([sys.executable, *argv], stdout=subprocess.DEVNULL, cwd=REPO, check=True)
    return time.perf_counter() - started


def peak_kib(argv: list[str], scratch: Path) -> int:
    out = scratch / "peak"
    subprocess.run(
        [sys.executable, "-c", PEAK, str(out), *argv], stdout=subprocess.DEVNULL, cwd=REPO, check=True
    )
    return int(out.read_text())


def startup(reps: int) -> None:
    runs: dict[str, list[float]] = {name: [] for name in COMMANDS}
    with tempfile.TemporaryDirectory(prefix="bench-footprint-") as scratch:
        peaks = {name: peak_kib(argv, Path(scratch)) for name, argv in COMMANDS.items()}  # warms up too
    for _ in range(reps):
        for name, argv in COMMANDS.items():
            runs[name].append(run_once(argv))
    bare_s, bare_kib = statistics.median(runs["bare python3 -c pass"]), peaks["bare python3 -c pass"]
    print(f"start-up, median of {reps} runs each, interleaved (ratio to the bare interpreter):")
    for name, measured in runs.items():
        took, rss = statistics.median(measured), peaks[name]
        print(
            f"  {name:<30} {took * 1000:7.1f} ms ({took / bare_s:4.1f}x)   "
            f"peak RSS {rss / 1024:6.1f} MiB ({rss / bare_kib:4.1f}x)"
        )


def trainer(python: Path | None, progress: Path) -> list[str]:
    if python is None:
        return [sys.executable, "-m", "sidecar.examples.trainer", "--steps", "1000000", "--step-s", "0.05"]
    script = REPO / "tests" / "trainers" / "ddp_trainer.py"
    return [
        str(python), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
        "--steps", "1000000", "--step-s", "0.05", "--progress-dir", str(progress),
    ]  # fmt: skip


def cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def steady(python: Path | None, window_s: float, interval_s: float) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-footprint-") as tmp:
        work = Path(tmp)
        progress = work / "progress"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SOAK_")}
        env |= {
            "PYTHONPATH": str(REPO),
            "SOAK_MONITOR__PROGRESS_DIR": str(progress),
            "SOAK_MONITOR__SAMPLE_INTERVAL_S": str(interval_s),
            "SOAK_MONITOR__STATUS_LINE": "off",
            "SOAK_GPU__BACKEND": "none",
            "SOAK_ARTIFACT__OUTPUT_DIR": str(work / "out"),
            "SOAK_DEADLINE__STORE_DIR": str(work / "deadlines"),
            "SOAK_LAUNCHER__RUN_DIR": str(work / "run"),
        }
        argv = [sys.executable, "-m", "sidecar.cli", "run", "--local", "--budget", str(window_s * 4 + 120)]
        sidecar = subprocess.Popen(
            [*argv, "--", *trainer(python, progress)],
            env=env,
            cwd=work,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        ready = work / "baseline-ready"
        baseline = subprocess.Popen([sys.executable, "-c", ENGINE, str(ready)], env=env, cwd=REPO)
        try:
            measure(psutil.Process(sidecar.pid), psutil.Process(baseline.pid), progress, ready, window_s)
        finally:
            for proc in (sidecar, baseline):
                if proc is sidecar:
                    os.killpg(sidecar.pid, signal.SIGTERM)
                else:
                    proc.kill()
                proc.wait(60)


def measure(
    sidecar: psutil.Process, baseline: psutil.Process, progress: Path, ready: Path, window_s: float
) -> None:
    give_up = time.monotonic() + 300
    while not (ready.exists() and progress.exists() and any(progress.iterdir())):
        if time.monotonic() > give_up:
            raise SystemExit("the trainer made no progress within 300 s")
        time.sleep(0.2)
    time.sleep(min(10.0, window_s))  # past the first samples and the launcher's start
    cpu0, started = cpu_s(sidecar), time.monotonic()
    rss: list[int] = []
    while time.monotonic() - started < window_s:
        rss.append(sidecar.memory_info().rss)
        time.sleep(0.5)
    used = cpu_s(sidecar) - cpu0
    elapsed = time.monotonic() - started
    base = baseline.memory_info().rss
    tree = sum(1 for _ in sidecar.children(recursive=True))
    print(f"steady sidecar over {elapsed:.0f} s, supervising a tree of {tree} processes:")
    median = statistics.median(rss)
    print(
        f"  sidecar RSS median {median / 2**20:.1f} MiB (max {max(rss) / 2**20:.1f}); "
        f"idle process with the same libraries {base / 2**20:.1f} MiB; ratio {median / base:.2f}x"
    )
    print(f"  sidecar CPU {used:.2f} s in {elapsed:.0f} s = {used / elapsed * 100:.2f} % of one core")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10, help="runs of each command (default 10)")
    parser.add_argument("--window", type=float, default=60.0, help="steady window, seconds (default 60)")
    parser.add_argument("--interval", type=float, default=5.0, help="sample interval, seconds (default 5)")
    parser.add_argument("--python", type=Path, help="a Python with torch for the torchrun tree")
    parser.add_argument("--smoke", action="store_true", help="2 runs each, a 5 s window, the example trainer")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(reps=2, window=5.0, interval=0.5)
        args = parser.parse_args()
    startup(args.reps)
    steady(args.python, args.window, args.interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
