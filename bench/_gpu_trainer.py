"""A real torch trainer for the GPU device check (bench/gpu_device_check.py): two worker processes on
the first GPU (on the CPU when torch sees none), each holding a known allocation and doing matrix work.

    python bench/_gpu_trainer.py --steps 40 --alloc-mib 256

Each worker writes its pid and what torch says it holds (``worker-R.json``: ``memory_reserved`` and
``memory_allocated`` in MiB, the device) before its first step, and a progress line per step. On the
soft stop (SIGUSR1, or $SOAK_SOFT_STOP_FILE appearing) each worker saves a checkpoint and records when
its file was on disk (``ckpt-R.json``: ``written_unix``). The parent waits for both, then writes the
``checkpoint.json`` record and ``run_summary.json`` the sidecar reads.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch  # type: ignore[import-not-found, unused-ignore]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sidecar.examples.replay_summary import run_summary, write_atomic

WORKERS = 2
MATRIX = 1024


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-s", type=float, default=0.2, help="pause per step (default 0.2)")
    parser.add_argument("--alloc-mib", type=int, default=256, help="each worker's allocation (default 256)")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--progress-dir", type=Path, default=Path(os.environ.get("SOAK_PROGRESS_DIR", ".")))
    return parser.parse_args()


def soft_stop_requested(asked: dict[str, bool]) -> bool:
    stop_file = os.environ.get("SOAK_SOFT_STOP_FILE")
    return asked["stop"] or bool(stop_file and Path(stop_file).exists())


def worker(args: argparse.Namespace) -> int:
    asked = {"stop": False}
    signal.signal(signal.SIGUSR1, lambda *_: asked.update(stop=True))
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    held = torch.empty(args.alloc_mib * 1024 * 1024, dtype=torch.uint8, device=device)
    a = torch.randn(MATRIX, MATRIX, device=device)
    mib = 1024.0 * 1024.0
    cuda = device.type == "cuda"
    write_atomic(
        args.progress_dir / f"worker-{args.worker}.json",
        {
            "pid": os.getpid(),
            "device": str(device),
            "name": torch.cuda.get_device_name(0) if cuda else "cpu",
            "memory_reserved_mib": torch.cuda.memory_reserved(0) / mib if cuda else None,
            "memory_allocated_mib": torch.cuda.memory_allocated(0) / mib if cuda else None,
        },
    )
    progress = args.progress_dir / f"progress-{args.worker}.jsonl"
    for step in range(1, args.steps + 1):
        if soft_stop_requested(asked):
            checkpoint = args.progress_dir / f"ckpt-{args.worker}.pt"
            torch.save({"step": step, "a": a.cpu()}, f"{checkpoint}.tmp")
            os.replace(f"{checkpoint}.tmp", checkpoint)
            write_atomic(
                args.progress_dir / f"ckpt-{args.worker}.json", {"step": step, "written_unix": time.time()}
            )
            return 0
        a = torch.tanh(a @ a / MATRIX)
        if cuda:
            torch.cuda.synchronize()
        with progress.open("a", encoding="utf-8") as log:
            log.write(f'{{"step": {step}, "t": {time.time()!r}, "held": {held.numel()}}}\n')
        time.sleep(args.step_s)
    return 0


def parent(args: argparse.Namespace) -> int:
    asked = {"stop": False}
    signal.signal(signal.SIGUSR1, lambda *_: asked.update(stop=True))
    argv = [sys.executable, __file__, "--steps", str(args.steps), "--step-s", str(args.step_s)]
    argv += ["--alloc-mib", str(args.alloc_mib), "--progress-dir", str(args.progress_dir)]
    workers = [subprocess.Popen([*argv, "--worker", str(n)]) for n in range(WORKERS)]
    codes = [w.wait() for w in workers]
    stopped = asked["stop"] or any((args.progress_dir / f"ckpt-{n}.json").exists() for n in range(WORKERS))
    if stopped:
        saved = [args.progress_dir / f"ckpt-{n}.pt" for n in range(WORKERS)]
        write_atomic(
            args.progress_dir / "checkpoint.json",
            {
                "step": 0,
                "path": str(args.progress_dir),
                "bytes": sum(p.stat().st_size for p in saved if p.exists()),
            },
        )
    failed = any(codes)
    summary = run_summary(
        steps=args.steps,
        completed=not stopped and not failed,
        classification="external_cancellation" if stopped else ("crash" if failed else "normal_completion"),
        error="soft stop" if stopped else (f"worker exit codes {codes}" if failed else None),
    )
    write_atomic(args.progress_dir / "run_summary.json", summary)
    return 1 if failed else 0


if __name__ == "__main__":
    parsed = parse()
    sys.exit(worker(parsed) if parsed.worker is not None else parent(parsed))
