"""A tiny PyTorch Lightning trainer adopting the kit in four lines (marked "soak:"), as
docs/trainers.md shows: a small causal language model, random tokens made in two DataLoader
workers, CPU; one rank, or two under torchrun (DDP over gloo).

    python tests/trainers/lightning_trainer.py --max-steps 40
    torchrun --standalone --nproc_per_node=2 tests/trainers/lightning_trainer.py --max-steps 40

Faults for the tests: ``--crash-at N`` raises in step N; ``--hang-at N`` sleeps forever in step N
(rank 0 only, so rank 1 waits in DDP's all-reduce).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import pytorch_lightning as pl  # type: ignore[import-not-found, unused-ignore]
import torch  # type: ignore[import-not-found, unused-ignore]
from torch import nn  # type: ignore[import-not-found, unused-ignore]
from torch.utils.data import DataLoader, Dataset  # type: ignore[import-not-found, unused-ignore]

from soak_sidecar_kit.lightning import SoakCallback  # soak: 1

VOCAB, CONTEXT = 64, 16


class RandomTokens(Dataset):  # type: ignore[misc, unused-ignore]
    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, index: int) -> object:
        return torch.randint(0, VOCAB, (CONTEXT + 1,), generator=torch.Generator().manual_seed(index))


class TinyLM(pl.LightningModule):  # type: ignore[misc, unused-ignore]
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.embed = nn.Embedding(VOCAB, 32)
        layer = nn.TransformerEncoderLayer(32, 2, 64, batch_first=True)
        self.body = nn.TransformerEncoder(layer, 1)
        self.head = nn.Linear(32, VOCAB)

    def training_step(self, batch: object, batch_idx: int) -> object:
        step = self.global_step + 1
        if step == self.args.crash_at:
            raise RuntimeError(f"crash requested at step {step}")
        if step == self.args.hang_at and self.global_rank == 0:
            while True:
                time.sleep(1)  # the hung line
        time.sleep(self.args.step_s)
        tokens: Any = batch
        mask = nn.Transformer.generate_square_subsequent_mask(CONTEXT)
        logits = self.head(self.body(self.embed(tokens[:, :-1]), mask=mask, is_causal=True))
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))

    def configure_optimizers(self) -> object:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--crash-at", type=int, default=0)
    parser.add_argument("--hang-at", type=int, default=0)
    parser.add_argument("--root", default=os.environ.get("TRAINER_OUTPUT_DIR", "lightning-root"))
    args = parser.parse_args()
    soak = SoakCallback()  # soak: 2
    trainer = pl.Trainer(
        max_steps=args.max_steps,
        accelerator="cpu",
        devices=int(os.environ.get("WORLD_SIZE", "1")),
        default_root_dir=args.root,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[soak],  # soak: 3
    )
    model, data = (
        TinyLM(args),
        DataLoader(RandomTokens(), batch_size=8, num_workers=2, persistent_workers=True),
    )
    trainer.fit(model, data, ckpt_path=soak.resume_checkpoint)  # soak: 4
    if trainer.global_rank == 0:
        print(f"trained to step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
