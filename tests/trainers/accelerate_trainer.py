"""A loop of one's own on accelerate's ``Accelerator`` with the trainer kit, as docs/trainers.md
shows: ``prepare``, an evaluation loop and ``accelerator.save_state`` every ``--every`` steps, the
stop's save at the soft stop, ``load_state`` on a resumed attempt. A small CPU model; one rank, or
two under torchrun (DDP over gloo).

    python tests/trainers/accelerate_trainer.py --steps 40 --output-dir accelerate-out

Every rank prints the step it stopped or finished at, and the step it resumed from.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch  # type: ignore[import-not-found, unused-ignore]
from accelerate import Accelerator  # type: ignore[import-not-found, unused-ignore]
from torch.utils.data import DataLoader, Dataset  # type: ignore[import-not-found, unused-ignore]

import soak_sidecar_kit

VOCAB, CONTEXT, WIDTH = 64, 16, 32


class RandomTokens(Dataset):  # type: ignore[misc, unused-ignore]
    def __init__(self, size: int, seed: int = 0) -> None:
        self.size, self.seed = size, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed + index)
        return torch.randint(0, VOCAB, (CONTEXT + 1,), generator=generator)


class Position:
    """The steps done, saved and loaded with the rest (``register_for_checkpointing``)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def loss_of(model: Any, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10, help="evaluate and save every N steps")
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--output-dir", default="accelerate-out")
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, WIDTH), torch.nn.Linear(WIDTH, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_data = DataLoader(RandomTokens(1 << 20), batch_size=8)
    eval_data = DataLoader(RandomTokens(32, seed=1 << 21), batch_size=8)
    model, optimizer, train_data, eval_data = accelerator.prepare(model, optimizer, train_data, eval_data)
    position = Position()
    accelerator.register_for_checkpointing(position)

    with soak_sidecar_kit.Soak(total_steps=args.steps) as soak:
        folder = soak.checkpoint_dir or args.output_dir  # the soak's, when it names one
        if soak.resume_checkpoint is not None:
            accelerator.load_state(soak.resume_checkpoint)
            print(f"rank {accelerator.process_index} resumed from step {position.step}", flush=True)
        batches = iter(accelerator.skip_first_batches(train_data, position.step))
        stop_path = os.path.join(folder, "soak-stop")
        for step in soak.steps(position.step, args.steps, save=accelerator.save_state, path=stop_path):
            model.train()
            loss = loss_of(model, next(batches))
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            position.step = step + 1
            soak.progress(position.step, loss=float(loss.detach()))
            time.sleep(args.step_s)
            if position.step % args.every == 0:
                with soak.phase("eval"):
                    model.eval()
                    with torch.no_grad():
                        losses = [accelerator.gather_for_metrics(loss_of(model, b)[None]) for b in eval_data]
                    accelerator.print(f"step {position.step} eval loss {float(torch.cat(losses).mean()):.4f}")
                path = os.path.join(folder, f"step-{position.step}")
                with soak.phase("checkpoint"):
                    accelerator.save_state(path)
                soak.checkpoint(position.step, path)
        print(f"rank {accelerator.process_index} ended at step {position.step}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
