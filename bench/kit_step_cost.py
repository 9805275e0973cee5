"""What the trainer kit costs a step: 2 gloo ranks on CPU (torchrun), a ~4 ms and a ~1 ms step.

Each rank runs the same fixed-length steps three ways, interleaved by rounds: bare; with the kit
(``soak.should_stop()`` and ``soak.progress(...)`` every step, rank 0 writing progress.jsonl); and
with a stop collective every step (a MAX all-reduce and its host read: what the kit did before).
Printed: seconds per step (the median over the rounds) and each against the bare step of the same run.

    python bench/kit_step_cost.py [--rounds 7] [--steps-per-round 1.0] [--smoke]
        [--python ~/.cache/soak-sidecar/trainer-venv/bin/python]

``--smoke``: two short rounds, a check that the benchmark still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PYTHON = Path.home() / ".cache" / "soak-sidecar" / "trainer-venv" / "bin" / "python"
STEP_MS = (4.0, 1.0)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--python", type=Path, default=DEFAULT_PYTHON, help="a Python with torch (the trainer venv)"
    )
    parser.add_argument("--rounds", type=int, default=7, help="rounds of each kind (default 7)")
    parser.add_argument(
        "--seconds-per-round", type=float, default=1.0, help="seconds of steps a segment (default 1)"
    )
    parser.add_argument("--smoke", action="store_true", help="two short rounds")
    args = parser.parse_args()
    rounds, seconds = (2, 0.05) if args.smoke else (args.rounds, args.seconds_per_round)
    results: dict[str, dict[str, float]] = {}
    for step_ms in STEP_MS:
        steps = max(1, round(seconds * 1000 / step_ms))
        argv = [
            str(args.python), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            str(REPO / "bench" / "_kit_step_worker.py"), "--rounds", str(rounds), "--steps", str(steps),
            "--step-ms", str(step_ms),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMPI_MCA_ess_singleton_isolated": "1"}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-2000:])
            return 1
        results.update(json.loads(done.stdout.strip().splitlines()[-1]))
    header = ("step", "bare s/step", "kit s/step", "kit/bare", "per-step collective", "ratio")
    print("{:>8} {:>12} {:>12} {:>9} {:>20} {:>6}".format(*header))
    for step_label, figures in results.items():
        bare, kit, collective = figures["bare"], figures["kit"], figures["collective_per_step"]
        print(
            f"{float(step_label):>6.1f}ms {bare:>12.6f} {kit:>12.6f} {kit / bare:>8.3f}x "
            f"{collective:>20.6f} {collective / bare:>5.3f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
