"""A stall's stacks: what taking them adds to the stop, and what a capture costs the trainer.

1. ``soak-sidecar run --local`` of a trainer that stalls (three Python processes, stdlib; with
   ``--torch``, torchrun with two gloo ranks where rank 1 waits in an all-reduce), with stacks
   (``SOAK_MONITOR__STACK_CAPTURE_S``, default 10) and, interleaved, without (0: the baseline).
   From the stall decision (control.json's ``requested_unix``) to the stacks taken (stacks.json's
   ``captured_unix``) and to the trainer gone (exit.json's ``ended_unix``, every descendant reaped).
2. The capture's cost to the trainer: a process timing a loop of 1 ms steps while ``py-spy dump``
   (the launcher's command) reads it, against the same loop unread. py-spy stops the process while
   it reads the stack: the longest step is the pause.

    python bench/stall_stacks.py [--runs 3] [--torch] [--dumps 20] [--smoke]

``--smoke``: one run each and three dumps, a check that the benchmark still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sidecar.launcher.stacks import find_py_spy

REPO = Path(__file__).resolve().parents[1]
TRAINER_PYTHON = Path.home() / ".cache" / "soak-sidecar" / "trainer-venv" / "bin" / "python"

STALL = """
import subprocess, sys, time
idle = "import time\\nwhile True: time.sleep(1)"
children = [subprocess.Popen([sys.executable, "-c", idle]) for _ in range(2)]
open(sys.argv[1] + "/progress.jsonl", "w").write("{}")
def hang_here():
    while True:
        time.sleep(1)
hang_here()
"""

LOOP = """
import sys, time
steps = []
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    t = time.perf_counter()
    x = 0
    while time.perf_counter() - t < 0.001:
        x += 1
    steps.append(time.perf_counter() - t)
print(max(steps) * 1000, sorted(steps)[len(steps) // 2] * 1000)
"""


def stall_command(progress: Path, torch: bool) -> list[str]:
    if torch:
        return [
            str(TRAINER_PYTHON), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            str(REPO / "tests" / "trainers" / "ddp_trainer.py"), "--steps", "100000", "--step-s", "0.05",
            "--fault", "hang", "--progress-dir", str(progress),
        ]  # fmt: skip
    return [sys.executable, "-c", STALL, str(progress)]


def one_stop(work: Path, *, stacks_s: float, torch: bool) -> dict[str, float]:
    progress, run_dir = work / "progress", work / "run"
    progress.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "SOAK_MONITOR__STACK_CAPTURE_S": str(stacks_s)}
    argv = [
        sys.executable, "-m", "sidecar.cli", "run", "--local", "--output", str(work / "out"),
        "--run-dir", str(run_dir), "--progress-dir", str(progress), "--deadline-dir", str(work / "dl"),
        "--sample-interval", "0.5", "--post-shutdown-grace", "0.5", "--gpu-backend", "none",
        "--status", "off", "--stale-progress", "4", "--startup-timeout", "120", "--",
        *stall_command(progress, torch),
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 12:
        raise SystemExit(f"expected the stall's exit 12, got {done.returncode}:\n{done.stderr[-2000:]}")
    requested = json.loads((run_dir / "control.json").read_text())["requested_unix"]
    ended = json.loads((run_dir / "exit.json").read_text())["ended_unix"]
    figures = {"gone_ms": (ended - requested) * 1000}
    if stacks_s > 0:
        stacks = json.loads((run_dir / "stacks.json").read_text())
        figures["captured_ms"] = (stacks["captured_unix"] - requested) * 1000
        figures["stacks"] = sum(p["stack"] is not None for p in stacks["processes"])
    return figures


def loop_steps(seconds: float, dumps: int, tool: str | None) -> tuple[float, float, float]:
    """(longest step ms, median step ms, mean dump ms) of the 1 ms loop, read ``dumps`` times."""
    loop = subprocess.Popen([sys.executable, "-c", LOOP, str(seconds)], stdout=subprocess.PIPE, text=True)
    took: list[float] = []
    time.sleep(0.5)
    for _ in range(dumps if tool is not None else 0):
        assert tool is not None
        start = time.perf_counter()
        subprocess.run([tool, "dump", "--pid", str(loop.pid)], capture_output=True, check=True)
        took.append((time.perf_counter() - start) * 1000)
        time.sleep(0.1)
    out, _ = loop.communicate()
    longest, median = (float(value) for value in out.split())
    return longest, median, statistics.mean(took) if took else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dumps", type=int, default=20)
    parser.add_argument("--torch", action="store_true", help="torchrun, two gloo ranks (the trainer venv)")
    parser.add_argument("--smoke", action="store_true", help="one run each, three dumps")
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.dumps = 1, 3
    tool = find_py_spy()
    if tool is None:
        raise SystemExit("py-spy is not installed (pip install -r requirements.lock)")
    with_stacks: list[dict[str, float]] = []
    without: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            with_stacks.append(one_stop(Path(tmp) / f"on{run}", stacks_s=10.0, torch=args.torch))
            without.append(one_stop(Path(tmp) / f"off{run}", stacks_s=0.0, torch=args.torch))
    trainer = "torchrun, 2 gloo ranks" if args.torch else "3 stdlib Python processes"
    print(f"stall -> stop, {trainer}, {args.runs} runs each, median ms")
    captured = statistics.median(f["captured_ms"] for f in with_stacks)
    gone_on = statistics.median(f["gone_ms"] for f in with_stacks)
    gone_off = statistics.median(f["gone_ms"] for f in without)
    print(f"  decision -> stacks captured: {captured:8.0f} ms ({with_stacks[0]['stacks']:.0f} stacks)")
    print(f"  decision -> trainer gone:    {gone_on:8.0f} ms with stacks, {gone_off:8.0f} ms without")
    print(f"  ratio with/without:          {gone_on / gone_off:8.2f}x (+{gone_on - gone_off:.0f} ms)")
    seconds = 0.5 + args.dumps * 0.2 + 1.0
    base_long, base_median, _ = loop_steps(seconds, 0, None)
    read_long, read_median, dump_ms = loop_steps(seconds, args.dumps, tool)
    print(f"capture cost to the trainer: a 1 ms loop, {args.dumps} py-spy dumps ({dump_ms:.0f} ms each)")
    print(
        f"  longest step: {read_long:7.2f} ms read, {base_long:7.2f} ms unread ({read_long / base_long:.1f}x)"
    )
    print(f"  median step:  {read_median:7.3f} ms read, {base_median:7.3f} ms unread")


if __name__ == "__main__":
    main()
