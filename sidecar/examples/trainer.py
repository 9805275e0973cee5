"""Example trainer for soak-sidecar, on the trainer kit (``soak_sidecar_kit``): progress records,
the soft stop, the checkpoint record and a valid run_summary.json.

Standard library and the kit only. Flags make it misbehave so that each verdict can be seen:

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
records a checkpoint and exits with an abnormal-but-valid summary (external_cancellation).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from soak_sidecar_kit import Soak

SLOT_ROWS = 64


def replay_manifest(steps: int) -> dict[str, Any]:
    """The runtime_manifest sections the default (replay) profile asks for, of ``steps`` published
    batches (``soak-sidecar schema run-summary``)."""
    return {
        "replay_ingress": {
            "ingress_depth": 8,
            "ingress_slot_rows": SLOT_ROWS,
            "published_sequence": steps,
            "release_sequence": steps,
            "occupancy": 0,
            "high_water_occupancy": min(8, max(1, steps)),
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


def _soak(args: argparse.Namespace) -> Soak:
    """The kit, on this trainer's flags: its progress dir and the checkpoint it resumes from."""
    environ = {**os.environ, "SOAK_PROGRESS_DIR": str(args.progress_dir)}
    if args.resume is not None:
        environ["SOAK_RESUME_CHECKPOINT"] = str(args.resume)
    # One line per step at this demo's pace: the report draws every step.
    return Soak(owner="example-trainer", environ=environ, total_steps=args.steps, progress_interval_s=0)


def _train_step(args: argparse.Namespace, soak: Soak, step: int, leaked: list[Any]) -> None:
    for _ in range(args.leak_fds):
        leaked.extend(os.pipe())
    if args.leak_rss:
        leaked.append(bytearray(args.leak_rss * 1024 * 1024))
    if not args.hang or step == 1:
        soak.progress(step, samples=step * SLOT_ROWS)
    print(f"step {step}/{args.steps}", flush=True)
    time.sleep(args.step_s)


def train(args: argparse.Namespace, soak: Soak, leaked: list[Any]) -> tuple[int, int]:
    """The steps from the resumed one on: the exit code and the step to go on from."""
    first_step = soak.resume_step or 1
    if args.resume is not None:
        print(f"resumed from {args.resume} at step {first_step}", flush=True)
    for step in range(first_step, args.steps + 1):
        if soak.should_stop():
            soak.checkpoint(step)  # this demo's whole state is its step: the one to go on from
            print(f"soft stop at step {step}: checkpoint written", flush=True)
            return 0, step
        if args.crash and step > args.steps // 2:
            if not args.no_summary:
                soak.fail(RuntimeError("example crash requested"))
            print("crashing as requested", file=sys.stderr, flush=True)
            return 3, step
        _train_step(args, soak, step, leaked)
    while args.hang:
        time.sleep(1)
    return 0, args.steps


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    args.progress_dir.mkdir(parents=True, exist_ok=True)
    soak = _soak(args)
    leaked: list[Any] = []
    if args.spawn_orphan:
        _spawn_orphan()
    # --no-summary: the run ends without the kit's summary.
    with contextlib.nullcontext(soak) if args.no_summary else soak:
        code, published = train(args, soak, leaked)
        soak.figure(total_env_steps=published * SLOT_ROWS)
        sections = replay_manifest(published)
        if args.bad_summary:
            sections["replay_ingress"]["occupancy"] = 1
        soak.manifest(**sections)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
