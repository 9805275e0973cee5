"""The soft stop and the deadline on a real torchrun job (two gloo ranks, DataLoader workers).

Two figures, each against a baseline measured in the same run (interleaved): the bundled example
trainer, a single stdlib process, under the same launcher.

- soft stop -> every rank's checkpoint written: from ``soft-stop.json``'s ``sent_unix`` to the
  newest checkpoint file's mtime (the soft stop is asked through control.json once every rank
  has made progress);
- the deadline's stop -> last process gone: the ranks (and the single process) ignore the soft stop
  and SIGTERM, but the ranks' DataLoader workers install a SIGTERM handler of their own and die on
  the deadline's TERM, the ranks fail with them and torchrun's agent ends on TERM too: on a quick
  machine before the deadline. So the figure starts at the stop that ended the run, as ``exit.json``
  tells (``reason`` "deadline"; ``deadline_expired``: the KILL at ``deadline_unix`` did, else the
  TERM at ``term_grace_s`` before it) and ends at its ``ended_unix`` (written after every descendant
  was reaped). Which stop ended how many runs is printed.

    python bench/real_trainers.py [--runs 3] [--deadline-in 25] [--smoke]
        [--python ~/.cache/soak-sidecar/trainer-venv/bin/python]

``--smoke``: one run with the deadline 15 s after the go, a check that the benchmark still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sidecar.adapters.rundir.channel import Heartbeat, RunDir
from sidecar.adapters.rundir.zipapp import launcher_path
from sidecar.launcher.protocol.files import read_json
from sidecar.launcher.protocol.go import GoRequest
from sidecar.launcher.protocol.names import SOFT_STOP_FILE
from sidecar.launcher.protocol.records import SoftStopRecord

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PYTHON = Path.home() / ".cache" / "soak-sidecar" / "trainer-venv" / "bin" / "python"


def torchrun(python: Path, progress: Path, *args: str) -> list[str]:
    script = REPO / "tests" / "trainers" / "ddp_trainer.py"
    return [
        str(python), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
        "--steps", "1000000", "--step-s", "0.05", "--progress-dir", str(progress), *args,
    ]  # fmt: skip


def example(python: Path, progress: Path) -> list[str]:
    return [
        str(python), "-m", "sidecar.examples.trainer", "--steps", "1000000", "--step-s", "0.05",
        "--progress-dir", str(progress),
    ]  # fmt: skip


# One process that ignores the soft stop and SIGTERM, as the torchrun ranks do with ignore-stop.
STUBBORN = """
import signal, sys, time
for s in (signal.SIGTERM, signal.SIGUSR1):
    signal.signal(s, signal.SIG_IGN)
open(sys.argv[1] + "/progress.jsonl", "w").write("{}")
while True:
    time.sleep(1)
"""


def stubborn(python: Path, progress: Path) -> list[str]:
    return [str(python), "-c", STUBBORN, str(progress)]


def launch(work: Path, python: Path, command: list[str]) -> tuple[subprocess.Popen[bytes], RunDir]:
    rd = RunDir(work / "run")
    rd.reset()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [str(python), str(launcher_path()), "--run-dir", str(rd.path), "--", *command]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    rd.wait_for_launcher(60, alive=lambda: proc.poll() is None)
    return proc, rd


def go(rd: RunDir, deadline_in: float, margin: float) -> GoRequest:
    go_request = GoRequest(
        launch_id=str(rd.launch_id),
        deadline_unix=time.time() + deadline_in,
        checkpoint_margin_s=margin,
        term_grace_s=margin / 2,
        heartbeat_timeout_s=600,
        kill_grace_s=1,
        console_log_bytes=1 << 20,
    )
    rd.give_go(go_request)
    return go_request


def wait_for(what: str, ready: Callable[[], bool], timeout_s: float = 120) -> None:
    end = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > end:
            raise TimeoutError(what)
        time.sleep(0.02)


def soft_stop_to_checkpoints(work: Path, python: Path, command: list[str], ranks: int, pattern: str) -> float:
    progress = work / "progress"
    progress.mkdir(parents=True, exist_ok=True)
    proc, rd = launch(work, python, command)
    with Heartbeat(rd, 0.5):
        go(rd, deadline_in=600, margin=10)
        wait_for("progress", lambda: len(list(progress.glob("progress*"))) >= ranks)
        time.sleep(0.5)  # a few steps on every rank
        rd.request("soft_stop", "bench")
        proc.wait(timeout=120)
    raw = read_json(str(rd.path / SOFT_STOP_FILE))
    soft = None if raw is None else SoftStopRecord.parse(raw)
    written = [path.stat().st_mtime for path in progress.glob(pattern)]
    if soft is None or len(written) != ranks:
        raise RuntimeError(f"soft stop not honoured: {soft}, {written}")
    return max(written) - soft.sent_unix


def deadline_to_gone(
    work: Path, python: Path, command: list[str], ranks: int, deadline_in: float
) -> tuple[float, str]:
    """Seconds from the deadline's stop that ended the run to the last process gone, and that stop."""
    progress = work / "progress"
    progress.mkdir(parents=True, exist_ok=True)
    proc, rd = launch(work, python, command)

    def started() -> bool:
        return len(list(progress.glob("progress*"))) >= ranks

    with Heartbeat(rd, 0.5):
        # Time to start (torch imports) before the deadline, then a soft stop and TERM.
        request = go(rd, deadline_in=deadline_in, margin=4)
        wait_for("progress", lambda: started() or proc.poll() is not None)
        proc.wait(timeout=120)
    if not started():
        raise RuntimeError("the trainer ended before every rank made progress: raise --deadline-in")
    record = json.loads(rd.file("exit.json").read_text())
    # "deadline": the launcher's TERM at term_grace_s before the deadline or its KILL at the deadline
    # ended the trainer (not its own exit, a lost heartbeat or a control request).
    if record["reason"] != "deadline":
        raise RuntimeError(f"the deadline did not end the run: {record['reason']}")
    # deadline_expired: the deadline came with a process still alive, so the KILL ended the run.
    if record["deadline_expired"]:
        return float(record["ended_unix"]) - request.deadline_unix, "KILL"
    return float(record["ended_unix"]) - (request.deadline_unix - request.term_grace_s), "TERM"


def report(name: str, ours: list[float], base: list[float]) -> None:
    mine, theirs = statistics.median(ours) * 1000, statistics.median(base) * 1000
    print(
        f"{name:<38} torchrun median {mine:8.1f} ms (max {max(ours) * 1000:8.1f})   "
        f"single process {theirs:8.1f} ms   ratio {mine / theirs:5.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--deadline-in", type=float, default=25, help="go -> deadline, seconds")
    parser.add_argument("--python", type=Path, default=DEFAULT_PYTHON, help="the trainer venv's Python")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: --runs 1 --deadline-in 15")
    args = parser.parse_args()
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(runs=1, deadline_in=15)
        args = parser.parse_args()
    python = args.python
    soft: tuple[list[float], list[float]] = ([], [])
    dead: tuple[list[float], list[float]] = ([], [])
    stops: tuple[list[str], list[str]] = ([], [])
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            a, b, c, d = (Path(tmp) / name for name in "abcd")
            soft[0].append(soft_stop_to_checkpoints(a, python, torchrun(python, a / "progress"), 2, "ckpt-*"))
            single = example(python, b / "progress")
            soft[1].append(soft_stop_to_checkpoints(b, python, single, 1, "checkpoint.json"))
            ignoring = torchrun(python, c / "progress", "--fault", "ignore-stop")
            for side, (work, command, ranks) in enumerate(
                ((c, ignoring, 2), (d, stubborn(python, d / "progress"), 1))
            ):
                gone, stop = deadline_to_gone(work, python, command, ranks, args.deadline_in)
                dead[side].append(gone)
                stops[side].append(stop)
    print(f"{args.runs} runs each, interleaved; torchrun: 2 gloo ranks with 2 DataLoader workers each")
    report("soft stop -> every rank's checkpoint", *soft)
    report("deadline's stop -> last process gone", *dead)
    for name, ended in zip(("torchrun", "single process"), stops, strict=True):
        term, kill = ended.count("TERM"), ended.count("KILL")
        print(f"  {name} runs ended by the deadline's TERM: {term}, by its KILL: {kill}")


if __name__ == "__main__":
    main()
