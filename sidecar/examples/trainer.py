"""Example trainer for soak-sidecar: writes progress and a valid run_summary.json.

Standard library only, so it runs under any Python. Flags make it misbehave so that each verdict
can be seen:

    --crash           exit 3 after half the steps, with an abnormal run_summary
    --hang            stop making progress (stale progress / deadline)
    --leak-fds N      open N extra pipes every step and keep them
    --leak-rss MIB    grow resident memory by MIB every step
    --spawn-orphan    start a setsid()'d worker that outlives the trainer
    --ignore-term     ignore SIGTERM (only SIGKILL stops it)
    --no-summary      do not write run_summary.json
    --bad-summary     write a run_summary.json that violates the replay-ingress contract
    --resume CKPT     continue from a checkpoint.json written at a soft stop

It honours the soft stop: on the soft-stop signal (SIGUSR1) or when $SOAK_SOFT_STOP_FILE appears it
writes a checkpoint and exits with an abnormal-but-valid summary (external_cancellation).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

SLOT_ROWS = 64


def write_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Replace ``path`` with the JSON of ``payload`` in one rename: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def run_summary(*, steps: int, completed: bool, classification: str, error: str | None) -> dict[str, Any]:
    """A run_summary.json in the shape soak-sidecar validates (schema 1, manifest 2)."""
    published = steps
    return {
        "status": "completed" if completed else "failed",
        "metric_schema_version": 1,
        "total_env_steps": steps * SLOT_ROWS,
        "runtime_manifest": {
            "schema_version": 2,
            "shutdown": {
                "classification": classification,
                "owner": "example-trainer",
                "phase": "final" if completed else "training",
                "exception": None if error is None else {"type": "RuntimeError", "message": error},
                "cleanup": {"errors": []},
            },
            "replay_ingress": {
                "ingress_depth": 8,
                "ingress_slot_rows": SLOT_ROWS,
                "published_sequence": published,
                "release_sequence": published,
                "occupancy": 0,
                "high_water_occupancy": min(8, max(1, published)),
                "backpressure_waits": 0,
                "backpressure_wait_s": 0.0,
                "early_returns": 0,
                "dropped_batches": 0,
                "closed_returns": 0,
                "stop_returns": 0,
            },
            "inference_flight": {
                "queue_depth": 0,
                "publication_lag": 0,
                "max_in_flight": 4,
                "max_publication_lag": 1,
            },
            "inference_memory_budget": {"ipc_event_count": steps},
        },
    }


def _spawn_orphan() -> None:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(3600)
        os._exit(0)
    os.wait()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    parser.add_argument("--step-s", type=float, default=0.3, help="seconds per step (default 0.3)")
    parser.add_argument(
        "--progress-dir",
        type=Path,
        default=Path(os.environ.get("SOAK_PROGRESS_DIR", "soak-output/progress")),
        help="where progress and run_summary.json go (default $SOAK_PROGRESS_DIR)",
    )
    parser.add_argument(
        "--resume",
        type=Path,
        metavar="CHECKPOINT",
        default=os.environ.get("SOAK_RESUME_CHECKPOINT") or None,
        help="continue from a checkpoint.json (default: $SOAK_RESUME_CHECKPOINT, set on a resumed attempt)",
    )
    parser.add_argument("--crash", action="store_true")
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--leak-fds", type=int, default=0, metavar="N")
    parser.add_argument("--leak-rss", type=int, default=0, metavar="MIB")
    parser.add_argument("--spawn-orphan", action="store_true")
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--no-summary", action="store_true")
    parser.add_argument("--bad-summary", action="store_true")
    return parser


def _soft_stop(args: argparse.Namespace, step: int) -> int:
    """Checkpoint, then an abnormal-but-valid summary: the soak resumes from here."""
    write_atomic(args.progress_dir / "checkpoint.json", {"step": step})
    run_record = os.environ.get("SOAK_CHECKPOINT_RECORD")  # the run's, kept for the next attempt
    if run_record and Path(run_record).absolute() != (args.progress_dir / "checkpoint.json").absolute():
        Path(run_record).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(Path(run_record), {"step": step})
    write_atomic(
        args.progress_dir / "run_summary.json",
        run_summary(
            steps=step,
            completed=False,
            classification="external_cancellation",
            error="stopped by the soft stop (the deadline near, or the soak stopped from outside)",
        ),
    )
    print(f"soft stop at step {step}: checkpoint written", flush=True)
    return 0


def _crash(args: argparse.Namespace, step: int) -> int:
    if not args.no_summary:
        write_atomic(
            args.progress_dir / "run_summary.json",
            run_summary(
                steps=step,
                completed=False,
                classification="learner_failure",
                error="example crash requested",
            ),
        )
    print("crashing as requested", file=sys.stderr, flush=True)
    return 3


def _train_step(args: argparse.Namespace, step: int, leaked: list[Any]) -> None:
    for _ in range(args.leak_fds):
        leaked.extend(os.pipe())
    if args.leak_rss:
        leaked.append(bytearray(args.leak_rss * 1024 * 1024))
    if not args.hang or step == 1:
        with (args.progress_dir / "progress.jsonl").open("a", encoding="utf-8") as log:
            # A structured progress record (sidecar.core.progress_records): its declared total lets
            # the sidecar estimate the finish against the deadline.
            record = {"step": step, "phase": "train", "total_steps": args.steps, "t": time.time()}
            log.write(json.dumps(record) + "\n")
    print(f"step {step}/{args.steps}", flush=True)
    time.sleep(args.step_s)


def _finish(args: argparse.Namespace) -> int:
    if args.hang:
        while True:
            time.sleep(1)
    if not args.no_summary:
        summary = run_summary(
            steps=args.steps, completed=True, classification="normal_completion", error=None
        )
        if args.bad_summary:
            summary["runtime_manifest"]["replay_ingress"]["occupancy"] = 1
        write_atomic(args.progress_dir / "run_summary.json", summary)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    soft_stop = {"requested": False}
    signal.signal(signal.SIGUSR1, lambda *_: soft_stop.update(requested=True))
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    soft_stop_file = os.environ.get("SOAK_SOFT_STOP_FILE")

    args.progress_dir.mkdir(parents=True, exist_ok=True)
    leaked: list[Any] = []
    if args.spawn_orphan:
        _spawn_orphan()
    first_step = 1
    if args.resume is not None:
        first_step = int(json.loads(args.resume.read_text(encoding="utf-8"))["step"])
        print(f"resumed from {args.resume} at step {first_step}", flush=True)
    for step in range(first_step, args.steps + 1):
        if soft_stop["requested"] or (soft_stop_file and Path(soft_stop_file).exists()):
            return _soft_stop(args, step)
        if args.crash and step > args.steps // 2:
            return _crash(args, step)
        _train_step(args, step, leaked)
    return _finish(args)


if __name__ == "__main__":
    raise SystemExit(main())
