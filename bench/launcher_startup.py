"""Launcher start-up: from exec to launcher.json (the launcher ready for the sidecar's go-ahead).

The launcher ships as a zipapp of the ``sidecar.launcher`` package (``install-launcher``); before,
it was one 1.7k-line file. Both are measured in the same run, interleaved, under the same
interpreter with ``-I -S`` as a trainer image runs it: the zipapp built from this checkout, the
single file read from git history (the last commit that had it), and a bare ``python -I -S -c
pass`` for the interpreter's own share. Prints measured figures only.

    python bench/launcher_startup.py [--runs 30] [--python PATH] [--smoke]

``--smoke``: three runs each, a check that the benchmark still runs (figures only).
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

from sidecar.adapters.rundir.zipapp import launcher_path
from sidecar.launcher.protocol.names import LAUNCHER_FILE

REPO = Path(__file__).resolve().parents[1]
# The last commit with the launcher as one file (sidecar/launcher.py).
SINGLE_FILE_COMMIT = "45a221f"
READY_TIMEOUT_S = 30.0


def single_file_launcher(dest: Path) -> Path:
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{SINGLE_FILE_COMMIT}:sidecar/launcher.py"],
        capture_output=True,
        check=True,
    ).stdout
    target = dest / "launcher-single-file.py"
    target.write_bytes(source)
    return target


def time_to_ready(python: str, launcher: Path, run_dir: Path) -> float:
    """Seconds from exec to launcher.json; the launcher (waiting for go.json) is then killed."""
    run_dir.mkdir()
    ready = run_dir / LAUNCHER_FILE
    started = time.perf_counter()
    proc = subprocess.Popen(
        [python, "-I", "-S", str(launcher), "--run-dir", str(run_dir), "--", "true"],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        while not ready.exists():
            if proc.poll() is not None:
                raise SystemExit(f"{launcher} exited {proc.returncode} before it was ready")
            if time.perf_counter() - started > READY_TIMEOUT_S:
                raise SystemExit(f"{launcher} not ready within {READY_TIMEOUT_S} s")
            time.sleep(0.0005)
        return time.perf_counter() - started
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def time_bare(python: str) -> float:
    started = time.perf_counter()
    subprocess.run([python, "-I", "-S", "-c", "pass"], check=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--python", default=sys.executable, help="the trainer image's interpreter")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    runs = 3 if args.smoke else args.runs
    with tempfile.TemporaryDirectory(prefix="soak-bench-start-") as tmp:
        work = Path(tmp)
        launchers = {"zipapp": launcher_path(), "single file": single_file_launcher(work)}
        times: dict[str, list[float]] = {name: [] for name in ("bare interpreter", *launchers)}
        for run in range(runs):
            times["bare interpreter"].append(time_bare(args.python))
            for name, launcher in launchers.items():
                run_dir = work / f"{name.replace(' ', '-')}-{run}"
                times[name].append(time_to_ready(args.python, launcher, run_dir))
    version = subprocess.run([args.python, "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    print(f"launcher start-up to {LAUNCHER_FILE}, Python {version} -I -S, {runs} runs each (interleaved)")
    print(f"{'':18} {'median ms':>10} {'p90 ms':>8} {'min ms':>8}")
    for name, values in times.items():
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        print(f"{name:18} {statistics.median(values) * 1e3:10.1f} {p90 * 1e3:8.1f} {ordered[0] * 1e3:8.1f}")
    ratio = statistics.median(times["zipapp"]) / statistics.median(times["single file"])
    print(f"zipapp / single file (median): {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
