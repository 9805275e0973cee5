"""A PyTorch Lightning script as a user writes it from docs/trainers.md: a LightningModule and a
LightningDataModule, validation every few batches, its own ModelCheckpoint (a top-k file and
``last.ckpt`` every N steps), gradient accumulation, a CheckpointIO plugin of its own (a slow store),
and the kit's four lines (marked "soak:"). One rank; two under torchrun, or under Lightning's own
launcher (``--devices 2``: rank 1 a child of rank 0), DDP over gloo on CPU.

    python tests/trainers/lightning_user_trainer.py --max-steps 12
    python tests/trainers/lightning_user_trainer.py --devices 2 --max-steps 12
    torchrun --standalone --nproc_per_node=2 tests/trainers/lightning_user_trainer.py --max-steps 12

Slow phases and faults for the tests (rank 0 only, so rank 1 waits in a collective):
``--eval-s S`` sleeps in each validation after the sanity check, ``--save-s S`` in the store's
first write; ``--hang-in-eval`` (there), ``--hang-in-save`` (in the module's ``on_save_checkpoint``) and
``--hang-in-step N`` (the training step after N optimizer steps) never return.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import pytorch_lightning as pl  # type: ignore[import-not-found, unused-ignore]
import torch  # type: ignore[import-not-found, unused-ignore]
from pytorch_lightning.callbacks import ModelCheckpoint  # type: ignore[import-not-found, unused-ignore]
from pytorch_lightning.plugins.io import TorchCheckpointIO  # type: ignore[import-not-found, unused-ignore]
from torch import nn  # type: ignore[import-not-found, unused-ignore]
from torch.utils.data import DataLoader, Dataset  # type: ignore[import-not-found, unused-ignore]

from soak_sidecar_kit.lightning import SoakCallback  # soak: 1

VOCAB, CONTEXT = 64, 16


def hang() -> None:
    while True:
        time.sleep(1)  # the hung line


class RandomTokens(Dataset):  # type: ignore[misc, unused-ignore]
    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed = size, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> object:
        generator = torch.Generator().manual_seed(self.seed + index)
        return torch.randint(0, VOCAB, (CONTEXT + 1,), generator=generator)


class Tokens(pl.LightningDataModule):  # type: ignore[misc, unused-ignore]
    def train_dataloader(self) -> object:
        return DataLoader(RandomTokens(1 << 20, 0), batch_size=8, num_workers=1, persistent_workers=True)

    def val_dataloader(self) -> object:
        return DataLoader(RandomTokens(16, 1 << 30), batch_size=8)


class TinyLM(pl.LightningModule):  # type: ignore[misc, unused-ignore]
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.embed = nn.Embedding(VOCAB, 32)
        self.body = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 2, 64, batch_first=True), 1)
        self.head = nn.Linear(32, VOCAB)

    def loss(self, tokens: Any) -> Any:
        mask = nn.Transformer.generate_square_subsequent_mask(CONTEXT)
        logits = self.head(self.body(self.embed(tokens[:, :-1]), mask=mask, is_causal=True))
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))

    def training_step(self, batch: object, batch_idx: int) -> object:
        if self.global_step == self.args.hang_in_step and self.global_rank == 0:
            hang()
        time.sleep(self.args.step_s)
        return self.loss(batch)

    def validation_step(self, batch: object, batch_idx: int) -> None:
        if batch_idx == 0 and self.global_rank == 0 and not self.trainer.sanity_checking:
            if self.args.hang_in_eval:
                hang()
            time.sleep(self.args.eval_s)
        self.log("val_loss", self.loss(batch), sync_dist=True)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.args.hang_in_save and self.global_rank == 0:
            hang()

    def configure_optimizers(self) -> object:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class SlowStore(TorchCheckpointIO):  # type: ignore[misc, unused-ignore]
    """The user's own plugin: a store that takes its time to write, the first time."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        time.sleep(self.seconds)
        self.seconds = 0.0  # slow the first time only: one slow save tells, more only cost time
        super().save_checkpoint(checkpoint, path, storage_options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--save-every", type=int, default=4, help="optimizer steps between saves")
    parser.add_argument("--val-every", type=int, default=10, help="batches between validations")
    parser.add_argument("--devices", type=int, default=int(os.environ.get("WORLD_SIZE", "1")))
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--eval-s", type=float, default=0.0)
    parser.add_argument("--save-s", type=float, default=0.0)
    parser.add_argument("--hang-in-eval", action="store_true")
    parser.add_argument("--hang-in-save", action="store_true")
    parser.add_argument("--hang-in-step", type=int, default=-1)
    parser.add_argument("--root", default=os.environ.get("TRAINER_OUTPUT_DIR", "lightning-root"))
    args = parser.parse_args()
    soak = SoakCallback()  # soak: 2
    checkpoints = ModelCheckpoint(
        dirpath=os.path.join(args.root, "checkpoints"), save_last=True, every_n_train_steps=args.save_every
    )
    trainer = pl.Trainer(
        max_steps=args.max_steps,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        accumulate_grad_batches=2,
        val_check_interval=args.val_every,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=1,
        default_root_dir=args.root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        plugins=[SlowStore(args.save_s)],
        callbacks=[checkpoints, soak],  # soak: 3
    )
    trainer.fit(TinyLM(args), Tokens(), ckpt_path=soak.resume_checkpoint)  # soak: 4
    print(f"rank {trainer.global_rank} ended at step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
