"""A real PyTorch DDP trainer for soak-sidecar's tests and docs: torchrun, gloo on CPU, DataLoader
workers. It is also the template docs/trainers.md points torchrun users at.

    torchrun --standalone --nproc_per_node=2 tests/trainers/ddp_trainer.py --steps 20

The soft stop, as soak-sidecar asks of a torchrun trainer:

- every rank installs a handler for the soft-stop signal ($SOAK_SOFT_STOP_SIGNAL, SIGUSR1 by
  default) and also polls $SOAK_SOFT_STOP_FILE: the launcher sends the signal only to processes
  that catch it, so torchrun's agent (no handler) is spared and its workers (each in a session of
  its own) are reached;
- the ranks agree on stopping with an all-reduce, so none is left alone in a collective;
- each rank writes its checkpoint, each node's local rank 0 writes that node's run_summary.json
  (every pod of a multi-pod soak has a sidecar that reads its own), and all exit 0.

Faults for the tests (--fault): ``hang`` (rank 0 stops before a collective: rank 1 blocks in it),
``raise`` (rank 1 raises), ``daemon`` (rank 0 leaves a setsid()'d process that ignores SIGTERM),
``ignore-stop`` (every rank ignores the soft stop and SIGTERM: only the deadline's KILL ends it).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch  # type: ignore[import-not-found, unused-ignore]
import torch.distributed as dist  # type: ignore[import-not-found, unused-ignore]
from torch.utils.data import DataLoader, Dataset  # type: ignore[import-not-found, unused-ignore]

from sidecar.examples.replay_summary import run_summary, write_atomic

FAULT_STEP = 3


class Numbers(Dataset):  # type: ignore[misc, unused-ignore]
    """An endless supply of (x, sum(x)) pairs, made in the DataLoader's worker processes."""

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> tuple[object, object]:
        x = torch.randn(8, generator=torch.Generator().manual_seed(index))
        return x, x.sum().reshape(1)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-s", type=float, default=0.1, help="extra seconds per step")
    parser.add_argument("--fault", choices=["hang", "raise", "daemon", "ignore-stop"])
    parser.add_argument("--progress-dir", type=Path, default=Path(os.environ.get("SOAK_PROGRESS_DIR", ".")))
    return parser.parse_args()


def main() -> int:
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # The node's first rank speaks for the node: its sidecar reads this node's progress dir.
    node_leader = int(os.environ.get("LOCAL_RANK", rank)) == 0
    print(f"rank {rank} of {dist.get_world_size()} on {socket.gethostname()}", flush=True)
    asked = {"stop": False}
    soft_stop_signal = signal.Signals[os.environ.get("SOAK_SOFT_STOP_SIGNAL", "SIGUSR1")]
    signal.signal(soft_stop_signal, lambda *_: asked.update(stop=True))
    soft_stop_file = os.environ.get("SOAK_SOFT_STOP_FILE")
    if args.fault == "ignore-stop":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        soft_stop_file = None
    if args.fault == "daemon" and rank == 0:
        leave_a_daemon()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(DataLoader(Numbers(), batch_size=16, num_workers=2))
    progress = args.progress_dir / f"progress-rank{rank}.jsonl"
    for step in range(1, args.steps + 1):
        inject(args.fault, rank, step)
        requested = args.fault != "ignore-stop" and (
            asked["stop"] or bool(soft_stop_file and Path(soft_stop_file).exists())
        )
        if agreed(requested):
            # Acted on: a late copy must not kill the rank while Python exits (it restores the
            # default action, death, of every signal it had a handler for).
            signal.signal(soft_stop_signal, signal.SIG_IGN)
            return soft_stop(model, args.progress_dir, rank, step, node_leader=node_leader)
        x, y = next(batches)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()  # the gradients' all-reduce
        optimizer.step()
        with progress.open("a", encoding="utf-8") as log:
            log.write(f'{{"step": {step}, "t": {time.time()!r}}}\n')
        time.sleep(args.step_s)
    if node_leader:
        summary = run_summary(
            steps=args.steps, completed=True, classification="normal_completion", error=None
        )
        write_atomic(args.progress_dir / "run_summary.json", summary)
    dist.destroy_process_group()
    return 0


def agreed(requested: bool) -> bool:
    """Every rank stops at the same step, or one would wait alone in the next collective."""
    flag = torch.tensor([1 if requested else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def soft_stop(model: object, progress_dir: Path, rank: int, step: int, *, node_leader: bool) -> int:
    checkpoint = progress_dir / f"ckpt-rank{rank}.pt"
    torch.save({"step": step, "model": model.module.state_dict()}, f"{checkpoint}.tmp")  # type: ignore[attr-defined]
    os.replace(f"{checkpoint}.tmp", checkpoint)
    print(f"rank {rank}: soft stop at step {step}, checkpoint written", flush=True)
    dist.barrier()  # every rank's checkpoint is on disk before any node's summary says so
    if node_leader:
        summary = run_summary(
            steps=step, completed=False, classification="external_cancellation", error="soft stop"
        )
        write_atomic(progress_dir / "run_summary.json", summary)
    dist.destroy_process_group()
    return 0


def inject(fault: str | None, rank: int, step: int) -> None:
    if step != FAULT_STEP:
        return
    if fault == "hang" and rank == 0:
        stall_before_the_collective()
    if fault == "raise" and rank == 1:
        raise RuntimeError("rank 1 failed on purpose")


def stall_before_the_collective() -> None:
    """Rank 1 now waits in agreed()'s all-reduce for ever (what its stack must show)."""
    while True:
        time.sleep(1)


def leave_a_daemon() -> None:
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(3600)"
    subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


if __name__ == "__main__":
    sys.exit(main())
