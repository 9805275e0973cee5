"""A user's own DDP loop on the trainer kit, as docs/trainers.md's own-loop section shows it, run
under torchrun (gloo, CPU): an evaluation and a ``torch.save`` of its own every few steps, each in
its phase and the save recorded; the stop at the soft stop through ``soak.steps``. Flags make an
evaluation or a save slow, or the trainer hang right after a save.

Each rank prints ``rank R stopped at step S at UNIX`` when the stop ends its loop: the tests check
that every rank stopped at the same step, within the delay docs/trainers.md states.
"""

from __future__ import annotations

import argparse
import os
import time

import torch  # type: ignore[import-not-found, unused-ignore]
import torch.distributed as dist  # type: ignore[import-not-found, unused-ignore]
from torch.nn.parallel import DistributedDataParallel  # type: ignore[import-not-found, unused-ignore]

import soak_sidecar_kit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--every", type=int, default=10, help="an evaluation and a save every N steps")
    parser.add_argument("--eval-s", type=float, default=0.0, help="seconds an evaluation takes")
    parser.add_argument("--save-s", type=float, default=0.0, help="seconds a save takes")
    parser.add_argument("--hang-after-save", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    os.makedirs(args.output_dir, exist_ok=True)

    def save(path: str) -> None:
        if rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
        time.sleep(args.save_s)
        dist.barrier()

    with soak_sidecar_kit.Soak() as soak:
        first = next_step = soak.resume_step or 0
        stop_path = os.path.join(args.output_dir, "stop.pt")
        for step in soak.steps(first, args.steps, save=save, path=stop_path):
            loss = model(torch.randn(16, 8)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(args.step_s)
            next_step = step + 1
            soak.progress(
                step + 1, samples=(step + 1) * 16, loss=loss.item() if soak.progress_due() else None
            )
            if (step + 1) % args.every == 0:
                with soak.phase("eval", step + 1), torch.no_grad():
                    model(torch.randn(64, 8))
                    time.sleep(args.eval_s)
                path = os.path.join(args.output_dir, f"step-{step + 1}.pt")
                with soak.phase("checkpoint", step + 1):
                    save(path)
                soak.checkpoint(step + 1, path)
                while args.hang_after_save:
                    time.sleep(1)
        if soak.should_stop():
            print(f"rank {rank} stopped at step {next_step} at {time.time():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
