"""A real MPI trainer for soak-sidecar's tests and docs: OpenMPI's mpirun, mpi4py collectives.

    mpirun -np 2 python3 -m mpi4py tests/trainers/mpi_trainer.py --steps 20

(``-m mpi4py``: an exception in one rank aborts the job instead of leaving the others waiting.)

Soft stop as docs/trainers.md asks of MPI users: mpirun catches SIGUSR1 and forwards it to the
ranks, and the launcher signals each rank that catches it too; every rank also polls
$SOAK_SOFT_STOP_FILE. The ranks agree with an all-reduce, each checkpoints, rank 0 writes
run_summary.json, all exit 0. Faults (--fault): ``hang`` (rank 1 stops before a collective),
``raise`` (rank 1 raises: mpirun aborts the job).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from mpi4py import MPI  # type: ignore[import-not-found, unused-ignore]

from sidecar.examples.replay_summary import run_summary, write_atomic

FAULT_STEP = 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-s", type=float, default=0.1)
    parser.add_argument("--fault", choices=["hang", "raise"])
    parser.add_argument("--progress-dir", type=Path, default=Path(os.environ.get("SOAK_PROGRESS_DIR", ".")))
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    asked = {"stop": False}
    soft_stop_signal = signal.Signals[os.environ.get("SOAK_SOFT_STOP_SIGNAL", "SIGUSR1")]
    signal.signal(soft_stop_signal, lambda *_: asked.update(stop=True))
    soft_stop_file = os.environ.get("SOAK_SOFT_STOP_FILE")
    total = 0.0
    for step in range(1, args.steps + 1):
        requested = asked["stop"] or bool(soft_stop_file and Path(soft_stop_file).exists())
        if comm.allreduce(1 if requested else 0, op=MPI.MAX):
            # mpirun forwards the signal too: a late copy must not kill the rank while Python exits
            # (it restores the default action, death, of every signal it had a handler for).
            signal.signal(soft_stop_signal, signal.SIG_IGN)
            write_atomic(args.progress_dir / f"ckpt-rank{rank}.json", {"step": step, "total": total})
            comm.Barrier()
            if rank == 0:
                summary = run_summary(
                    steps=step, completed=False, classification="external_cancellation", error="soft stop"
                )
                write_atomic(args.progress_dir / "run_summary.json", summary)
            return 0
        if step == FAULT_STEP and rank == 1 and args.fault == "hang":
            while True:
                time.sleep(1)
        if step == FAULT_STEP and rank == 1 and args.fault == "raise":
            raise RuntimeError("rank 1 failed on purpose")
        total += comm.allreduce(float(step), op=MPI.SUM)
        with (args.progress_dir / f"progress-rank{rank}.jsonl").open("a", encoding="utf-8") as log:
            log.write(json.dumps({"step": step, "t": time.time()}) + "\n")
        time.sleep(args.step_s)
    if rank == 0:
        summary = run_summary(
            steps=args.steps, completed=True, classification="normal_completion", error=None
        )
        write_atomic(args.progress_dir / "run_summary.json", summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
